"""The compile table: per attention option, whether torch.compile captures its layer as one
graph (graph breaks and their reasons) and the speed-up inductor gives forward + backward.

    python scripts/bench_compile.py                      # every option, T = 1024, CPU
    python scripts/bench_compile.py --attention full local --length 2048 --no-speed

Writes results/bench/compile.{md,csv} (``--out``).
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch

from xformer_bench.bench.attention_cost import Shape
from xformer_bench.bench.compile_check import graph_breaks, speedup
from xformer_bench.config import CONF_DIR


def main() -> None:
    options = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", nargs="+", default=options, choices=options)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--no-speed", action="store_true", help="graph breaks only")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path("results/bench/compile"))
    args = parser.parse_args()

    shape, device, rows = Shape(1, 4, 64), torch.device(args.device), []
    for name in args.attention:
        found = graph_breaks(name)
        row = {"attention": name, "full_graph": found.breaks == 0, "graphs": found.graphs,
               "breaks": found.breaks, "reasons": "; ".join(found.reasons)}
        if not args.no_speed:
            try:
                eager, compiled = speedup(name, args.length, shape, device)
            except Exception as error:  # noqa: BLE001 -- inductor's failure is this row's result
                eager = compiled = None
                lines = str(error).splitlines() or [type(error).__name__]
                cause = next((line for line in lines if "Error:" in line), lines[0])
                row["reasons"] = f"inductor failed: {cause[:100]}"
            if eager is not None and compiled is not None:  # None: not causal, not timed
                row.update(eager_ms=1e3 * eager, compiled_ms=1e3 * compiled,
                           speedup=eager / compiled)
        rows.append(row)
        print(row, flush=True)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else \
        f"CPU ({torch.get_num_threads()} threads)"
    speed = ("speed not measured (--no-speed)" if args.no_speed else
             f"speed-up of forward + backward at T = {args.length}, batch 1, 4 heads of 64 "
             "(inductor against eager, fastest of 3)")
    lines = [f"torch.compile per attention option on {where}, torch {torch.__version__}: graph "
             f"breaks of one causal layer forward (TorchDynamo's explain); {speed}.",
             "", "| option | full graph | breaks | eager ms | compiled ms | "
             "speed-up | first break reasons |", "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        speed = (f"{r['eager_ms']:.1f} | {r['compiled_ms']:.1f} | {r['speedup']:.2f}x"
                 if "speedup" in r else " | | ")
        lines.append(f"| {r['attention']} | {'yes' if r['full_graph'] else 'no'} | "
                     f"{r['breaks']} | {speed} | {r['reasons']} |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    with args.out.with_suffix(".csv").open("w", newline="") as handle:
        fields = list(dict.fromkeys(key for row in rows for key in row))
        writer = csv.DictWriter(handle, fieldnames=fields, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {args.out.with_suffix('.md')}")


if __name__ == "__main__":
    main()
