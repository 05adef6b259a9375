"""xbench's vanilla Transformer against x-transformers' decoder on a real text file.

    pip install x-transformers                      # the optional peer
    python scripts/compare_baseline.py corpus.txt   # 3 seeds each, prints mean ± std
    python scripts/compare_baseline.py corpus.txt --steps 200 --seeds 0 -- head.tie=false
    python scripts/compare_baseline.py --merge a.json b.json   # summarise runs made in parts

Both models train through xbench's own training path -- the same ``LanguageModelTask``
(AdamW, warm-up and schedule from ``optim``, gradient clipping from ``trainer``), the same
byte windows (``data=text``: 90/5/5 split, the step-``i`` windows a function of the seed) and
the same evaluation (the whole validation and test splits in non-overlapping windows) -- so the
only difference is the model.  Defaults are the size of the shipped comparison: d_model 256,
4 layers, 4 heads, d_ff 1024, seq 256, batch 16, 400 steps, lr 1e-3, learned absolute
positions, GELU.  x-transformers is built with its own defaults:
``TransformerWrapper(num_tokens=256, max_seq_len=seq, attn_layers=Decoder(dim, depth, heads,
attn_dim_head=dim/heads, ff_mult=d_ff/dim))``.  ``--json`` writes every run's numbers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.config import compose_config

SYSTEMS = ("xbench", "x_transformers")


class XTransformersLM(nn.Module):
    """x-transformers' default decoder-only LM behind the interface xbench's task calls."""

    def __init__(self, d_model: int, n_layers: int, n_heads: int, d_ff: int, seq_len: int):
        super().__init__()
        try:
            from x_transformers import Decoder, TransformerWrapper
        except ImportError as error:
            raise SystemExit("error: the peer needs x-transformers: pip install x-transformers") from error
        self.net = TransformerWrapper(
            num_tokens=256, max_seq_len=seq_len,
            attn_layers=Decoder(dim=d_model, depth=n_layers, heads=n_heads,
                                attn_dim_head=d_model // n_heads, ff_mult=d_ff / d_model),
        )

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                **loss) -> torch.Tensor:
        """(B, T) -> (B, T, V) logits, or given ``targets`` their cross-entropy
        (``F.cross_entropy``'s options ``loss``), as xbench's models answer the task."""
        logits = self.net(tokens)
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), **loss)

    def auxiliary_loss(self) -> None:
        return None

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())


def build(system: str, config: dict) -> nn.Module:
    if system == "xbench":
        from xformer_bench.models.build import build_model

        return build_model(config, vocab_size=256)
    m = config["model"]
    return XTransformersLM(m["d_model"], m["n_layers"], m["n_heads"], m["d_ff"],
                           config["data"]["seq_len"])


def train_once(system: str, config: dict) -> dict:
    """One seeded run of ``system`` through xbench's task and trainer: its bpb and speed."""
    import lightning as L

    from xformer_bench.registry import DATA
    from xformer_bench.tasks.lm import LanguageModelTask
    from xformer_bench.training.throughput import Throughput
    from xformer_bench.training.trainer import build_trainer

    L.seed_everything(config["seed"], verbose=False)
    datamodule = DATA.build(config["data"], seed=config["seed"], data_dir=config["paths"]["data_dir"])
    model = build(system, config)
    task = LanguageModelTask(model, config["optim"], max_steps=config["trainer"]["max_steps"])
    throughput = Throughput(config["data"]["seq_len"] * config["data"]["batch_size"])
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(config["trainer"], [], [throughput], Path(run_dir))
        started = time.perf_counter()
        trainer.fit(task, datamodule=datamodule)
        val = float(trainer.callback_metrics["val/bpb"])
        test = trainer.test(task, datamodule=datamodule, verbose=False)[0]["test/bpb"]
    return {"system": system, "seed": config["seed"], "params": model.num_parameters(),
            "val_bpb": val, "test_bpb": float(test), "steps_per_sec": throughput.steps_per_sec,
            "wall_sec": time.perf_counter() - started}


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.4f} ± {std:.4f}"


def summarise(runs: list[dict], note: str) -> None:
    print(f"\n{'system':<16}{'params':>10}  {'val bpb':>17}  {'test bpb':>17}  steps/s")
    for system in dict.fromkeys(r["system"] for r in runs):
        mine = [r for r in runs if r["system"] == system]
        print(f"{system:<16}{mine[0]['params']:>10,}  {mean_std([r['val_bpb'] for r in mine]):>17}"
              f"  {mean_std([r['test_bpb'] for r in mine]):>17}"
              f"  {statistics.mean(r['steps_per_sec'] for r in mine):.2f}"
              f"   (seeds {', '.join(str(r['seed']) for r in mine)}; {note})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", help="a text file (byte-level, split 90/5/5 by position)")
    parser.add_argument("overrides", nargs="*", help="extra xbench overrides (after --)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--systems", nargs="+", choices=SYSTEMS, default=list(SYSTEMS))
    parser.add_argument("--json", type=Path, help="write every run's numbers here")
    parser.add_argument("--merge", type=Path, nargs="+", help="summarise --json files instead")
    args = parser.parse_intermixed_args()
    if args.merge:
        summarise([r for f in args.merge for r in json.loads(f.read_text())["runs"]], "merged")
        return
    if not args.path:
        parser.error("give a text file, or --merge FILES")
    base = [
        "model=vanilla", "position=learned", "activation=gelu", "data=text",
        f"data.path={Path(args.path).resolve()}", "model.d_model=256", "model.n_layers=4",
        "model.n_heads=4", "model.d_ff=1024", "data.seq_len=256", "data.batch_size=16",
        "optim.lr=1e-3", f"trainer.max_steps={args.steps}", "trainer.val_checks=1",
        "trainer.progress_bar=false", "logger=none",
    ]
    runs = []
    for seed in args.seeds:
        config = compose_config(*base, f"seed={seed}", *args.overrides)
        for system in args.systems:
            runs.append(train_once(system, config))
            print(json.dumps(runs[-1]), flush=True)
    summarise(runs, f"{args.steps} steps, {' '.join(args.overrides) or 'defaults'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"args": {**vars(args), "json": str(args.json), "merge": None},
                                         "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
