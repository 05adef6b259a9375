"""Activation memory of one training step against depth, per system preset (Reformer's claim:
reversible layers keep it flat).

    python scripts/bench_depth_memory.py                          # vanilla, reformer, L = 2, 4, 8
    python scripts/bench_depth_memory.py --models vanilla sparse_transformer --depths 2 8 \
        --seq-len 2048 --batch 2

Measures each configuration with the allocation tracker runs use for their ``step_memory_mb``
(:mod:`xformer_bench.training.step_memory`: the tensors one forward + backward allocates, not
parameters nor optimizer state) and writes results/bench/depth_memory.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from xformer_bench.config import compose_config
from xformer_bench.models.build import build_model
from xformer_bench.training.step_memory import training_step_memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["vanilla", "reformer"])
    parser.add_argument("--depths", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--out", type=Path, default=Path("results/bench/depth_memory.md"))
    args = parser.parse_args()

    lines = [f"| model | {' | '.join(f'MiB L={d}' for d in args.depths)} | "
             f"L={args.depths[-1]} / L={args.depths[0]} |",
             "|---|" + "---:|" * (len(args.depths) + 1)]
    for name in args.models:
        mib = []
        for depth in args.depths:
            config = compose_config(f"model={name}", f"model.n_layers={depth}",
                                    f"data.seq_len={args.seq_len}")
            torch.manual_seed(0)
            model = build_model(config, vocab_size=256)
            mib.append(training_step_memory(model, args.seq_len, args.batch, 256))
        lines.append(f"| {name} | {' | '.join(f'{m:.1f}' for m in mib)} | {mib[-1] / mib[0]:.2f}x |")
        print(lines[-1])
    caption = (f"Activation memory of one training step (allocation tracker), batch {args.batch} "
               f"x {args.seq_len} bytes, the presets' other sizes.")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + f"\n\n{caption}\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
