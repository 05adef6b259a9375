"""Time and memory of every attention option against sequence length (LRA Table 2's shape).

    python scripts/bench_attention.py                       # every option, T = 512 ... 16384
    python scripts/bench_attention.py --attention full local lsh --lengths 1024 4096 \
        --batch 1 --heads 4 --head-dim 64 --bidirectional --cap-seconds 10

Writes results/bench/attention.{md,tex,csv} and attention.{png,pdf} (log-log time and memory
against T); with --scope model, attention_step.md (a model's training step against its Amdahl
bound: :mod:`xformer_bench.bench.step_bound`); with --scope kernel, attention_kernel.* (q, k, v -> out alone, where the option has
a kernel); with --bidirectional, the same names ending in _bidirectional; on CUDA (synchronised
timing, max_memory_allocated, bf16 autocast by default), attention_cuda*.  The CSV grows as the
sweep goes; ``--from-csv FILE`` renders the tables and plots of an earlier (or cut-off) sweep.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import csv

from xformer_bench.bench.attention_cost import (
    CSV_FIELDS, Caps, Shape, csv_row, from_csv, plot, sweep, table, to_csv)
from xformer_bench.config import CONF_DIR
from xformer_bench.results import latex, markdown


def main() -> None:
    options = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", nargs="+", default=options, choices=options)
    parser.add_argument("--lengths", nargs="+", type=int,
                        default=[512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--bidirectional", action="store_true", help="default: causal")
    parser.add_argument("--scope", choices=("layer", "kernel", "model"), default="layer",
                        help="time the whole sublayer, the kernel alone where there is one, or "
                        "a model's training step against its Amdahl bound (CPU)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes (the fastest counts)")
    parser.add_argument("--cap-seconds", type=float, default=30.0)
    parser.add_argument("--cap-megabytes", type=float, default=8192.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), help="default: bf16 on CUDA")
    parser.add_argument("--where", help="the device's name in the caption (with --from-csv)")
    parser.add_argument("--from-csv", type=Path, help="render this CSV; measure nothing")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args()

    if args.scope == "model":
        from xformer_bench.bench.step_bound import StepShape, markdown as step_markdown
        from xformer_bench.bench.step_bound import sweep as step_sweep

        names = ["full", *(n for n in args.attention if n != "full")]
        points = step_sweep(names, sorted(args.lengths), StepShape(batch=args.batch),
                            max(3, args.repeats))
        args.out.mkdir(parents=True, exist_ok=True)
        path = args.out / "attention_step.md"
        path.write_text(step_markdown(points, f"CPU ({torch.get_num_threads()} threads)"))
        print(f"wrote {path}")
        return
    device = torch.device(args.device)
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    shape = Shape(args.batch, args.heads, args.head_dim, not args.bidirectional, args.scope, dtype)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / ("attention" + ("_cuda" if device.type == "cuda" else "")
                       + ("" if args.scope == "layer" else "_kernel")
                       + ("_bidirectional" if args.bidirectional else ""))
    where = args.where or (torch.cuda.get_device_name(device) if device.type == "cuda" else
                           f"CPU ({torch.get_num_threads()} threads)")
    if args.from_csv:
        results = from_csv(args.from_csv.read_text())
    else:
        names = ["full", *(n for n in args.attention if n != "full")]  # the reference first
        with stem.with_suffix(".csv").open("w", newline="") as partial:
            writer = csv.DictWriter(partial, fieldnames=CSV_FIELDS, lineterminator="\n")
            writer.writeheader()
            results = sweep(names, sorted(args.lengths), shape,
                            Caps(args.cap_seconds, args.cap_megabytes), device, args.repeats,
                            on_result=lambda m: (writer.writerow(csv_row(m)), partial.flush()))
    rendered = table(results, shape, where)
    stem.with_suffix(".md").write_text(markdown.render(rendered))
    stem.with_suffix(".tex").write_text(latex.render(rendered))
    stem.with_suffix(".csv").write_text(to_csv(results))
    for path in [stem.with_suffix(s) for s in (".md", ".tex", ".csv")] + plot(results, stem):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
