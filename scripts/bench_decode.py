"""Decoding cost against tokens generated: time per token and the memory the decode cache holds.

    python scripts/bench_decode.py --attention full linear mamba2      # L = 1K ... 16K
    python scripts/bench_decode.py --attention full local --lengths 64 128 --d-model 64 --timed 8

Writes results/bench/decode.{md,csv} (on CUDA decode_cuda.*; bf16 weights and cache by
default there).  Full attention with a key/value cache grows in time and memory per token; an
option whose mixers all keep a recurrent state must not: one whose cache grows is an
``error:`` line and exit status 1 (after the files are written).  See
:mod:`xformer_bench.bench.decode_cost`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from xformer_bench.bench.decode_cost import DecodeShape, state_growth, sweep, table, to_csv
from xformer_bench.config import CONF_DIR
from xformer_bench.results import markdown


def main(argv: list[str] | None = None) -> int:
    options = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", nargs="+", default=["full", "linear"], choices=options)
    parser.add_argument("--lengths", nargs="+", type=int, default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--timed", type=int, default=32, help="steps timed per length")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), help="default: bf16 on CUDA")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    shape = DecodeShape(args.d_model, args.heads, args.layers, args.batch, args.timed,
                        args.dtype or ("bf16" if device.type == "cuda" else "fp32"))
    where = (torch.cuda.get_device_name(device) if device.type == "cuda" else
             f"CPU ({torch.get_num_threads()} threads)")
    names = list(dict.fromkeys(["full", *args.attention]))  # the reference first
    try:
        points = sweep(names, args.lengths, shape, device)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    stem = args.out / ("decode" + ("_cuda" if device.type == "cuda" else ""))
    stem.with_suffix(".md").write_text(markdown.render(table(points, shape, where)))
    stem.with_suffix(".csv").write_text(to_csv(points))
    for suffix in (".md", ".csv"):
        print(f"wrote {stem.with_suffix(suffix)}")
    problems = state_growth(points)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
