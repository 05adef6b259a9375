"""The training race: xbench's training path vs a hand-written loop and x-transformers.

    python scripts/bench_train.py                       # CPU: default, d256-L4, d512-L8
    python scripts/bench_train.py --sizes d1024-L12 --precision bf16-mixed   # on a GPU

See :mod:`xformer_bench.bench.train_race` for what each contender runs.  Writes
``results/bench/train.{md,json}`` (``--out``): tokens/s, ms/step, step memory, MFU (CUDA), and
xbench's speed relative to the floor and to x-transformers.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

from xformer_bench.bench.train_race import CONTENDERS, SIZES, as_rows, race


def markdown(rows: list[dict], setting: str) -> str:
    lines = [f"Training race ({setting})", "",
             "| size | contender | params | tokens/s | ms/step | step MiB | MFU | vs floor "
             "| vs x-transformers |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        ratio = lambda v: "" if v is None else f"{v:.2f}x"  # noqa: E731
        mfu = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f} %"
        lines.append(f"| {r['size']} | {r['contender']} | {r['params']:,} | "
                     f"{r['tokens_per_sec']:,.0f} | {r['ms_per_step']:.1f} | "
                     f"{r['step_memory_mib']:.1f} | {mfu} | {ratio(r['vs_floor'])} | "
                     f"{ratio(r['vs_x_transformers'])} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES),
                        default=["d1024-L12"] if cuda else ["default", "d256-L4", "d512-L8"])
    parser.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=list(CONTENDERS))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per contender")
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument("--precision", default="bf16-mixed" if cuda else "32-true")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile every contender (inductor; trainer.compile=true)")
    parser.add_argument("--out", type=Path, default=Path("results/bench/train"))
    args = parser.parse_args()

    rows = []
    for size in args.sizes:
        rows += as_rows(race(size, args.steps, args.device, args.precision,
                             tuple(args.contenders), args.compile))
        print(json.dumps(rows[-len(args.contenders):]), flush=True)
    device = torch.cuda.get_device_name() if args.device == "cuda" else platform.processor() \
        or platform.machine()
    setting = (f"{args.device} ({device}, {torch.get_num_threads()} threads), {args.precision}, "
               f"{'compiled (inductor)' if args.compile else 'eager'}, "
               f"{args.steps} timed steps, torch {torch.__version__}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(markdown(rows, setting))
    args.out.with_suffix(".json").write_text(json.dumps({"setting": setting, "rows": rows},
                                                        indent=1))
    print(markdown(rows, setting))


if __name__ == "__main__":
    main()
