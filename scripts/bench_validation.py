"""The share of each domain's default run that goes to validation, whole split at every
validation against ``data.val_subsample`` (intermediate validations on the split's first
batches, the last on the whole split).

    python scripts/bench_validation.py                    # every domain
    python scripts/bench_validation.py --data cifar10 wmt14 --steps 5 --batches 2

Writes results/bench/validation.md.  The step and batch times are measured through the real
training path, on stand-in data of the same shapes where the real data cannot be had offline;
the share is projected for the default schedule: :mod:`xformer_bench.bench.validation_share`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from xformer_bench.bench.validation_share import DOMAINS, markdown, measure


def main(argv: list[str] | None = None) -> int:
    names = [d.data for d in DOMAINS]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=names, choices=names)
    parser.add_argument("--steps", type=int, default=10, help="training steps timed")
    parser.add_argument("--batches", type=int, default=2, help="validation batches timed")
    parser.add_argument("--out", type=Path, default=Path("results/bench"))
    args = parser.parse_args(argv)
    shares = []
    for domain in (d for d in DOMAINS if d.data in args.data):
        print(f"timing {domain.data} ...", file=sys.stderr)
        shares.append(measure(domain, args.steps, args.batches))
    text = markdown(shares, f"CPU, {torch.get_num_threads()} threads")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "validation.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
