"""The whole run against a hand-written script: tokens/s from the process's start to the end of
its last training step, each contender in a fresh process (imports, data, model, every step).

* ``xbench``: ``python -m xformer_bench.cli`` with :func:`~.train_race.overrides_for` (one
  validation of one batch at the end, left out of its clock, and the test after it);
  the record's ``training_wall_seconds``.
* ``floor``: this module as a script (:func:`floor_script`): a minimal hand-written training
  script over the same model, the same synthetic corpus and batch -- windows drawn at random
  positions each step, forward, cross-entropy, backward, clipping at 1, AdamW.  Its clock
  leaves out composing the Hydra config it builds the model from (a hand-written script would
  construct the model directly).

``steady`` tokens/s (:mod:`.train_race`) leave out start-up and the first step; the ratio of the
two shows what a run pays beyond its steps.

    python -m xformer_bench.bench.whole_run floor --size default --steps 50
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xformer_bench.bench.train_race import SIZES, overrides_for


def _corpus_size(size: dict) -> int:
    return max(200_000, 4 * size["seq_len"] * size["batch"])  # as overrides_for's data.size


def floor_script(name: str, steps: int) -> dict[str, float]:
    """Train ``steps`` steps the hand-written way; seconds from this process's start to the end
    of the last step, less composing the config (``compose_seconds``, reported)."""
    import torch
    import torch.nn.functional as F

    from xformer_bench.config import compose_config
    from xformer_bench.data.synthetic import generate
    from xformer_bench.models.build import build_model
    from xformer_bench.training.throughput import process_started_at

    size = SIZES[name]
    composing = time.time()
    config = compose_config(*overrides_for(size, steps, "cpu", "32-true"))
    compose_seconds = time.time() - composing
    torch.manual_seed(0)
    model = build_model(config, vocab_size=256).train()
    corpus = torch.from_numpy(generate(_corpus_size(size), 0))
    train = corpus[: int(0.9 * len(corpus))]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    generator = torch.Generator().manual_seed(0)
    span = torch.arange(size["seq_len"] + 1)
    first_step = time.time()
    for _ in range(steps):
        starts = torch.randint(0, len(train) - size["seq_len"] - 1, (size["batch"], 1),
                               generator=generator)
        tokens = train[starts + span].long()  # (B, T + 1)
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    ended = time.time()
    started = process_started_at()
    return {"seconds": ended - started - compose_seconds, "compose_seconds": compose_seconds,
            "startup_seconds": first_step - started - compose_seconds}


def whole_run(contender: str, name: str, steps: int) -> dict[str, float | None]:
    """Whole-run ``tokens_per_sec`` of ``contender`` ("xbench" or "floor") at size ``name``,
    with its ``startup_seconds`` (process start to the first step) and, for xbench, the
    ``probe_seconds`` among them (FLOPs, step memory, attended pairs: the record's)."""
    size = SIZES[name]
    with tempfile.TemporaryDirectory() as folder:
        if contender == "xbench":
            command = [sys.executable, "-m", "xformer_bench.cli",
                       *overrides_for(size, steps, "cpu", "32-true"),
                       f"paths.results_dir={folder}", f"hydra.run.dir={folder}/run"]
        else:
            command = [sys.executable, "-m", "xformer_bench.bench.whole_run", "floor",
                       "--size", name, "--steps", str(steps)]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{contender} whole run failed:\n{done.stderr[-2000:]}")
        if contender == "xbench":
            record = json.loads(next(Path(folder).glob("*/*.json")).read_text())
            seconds, startup = record["training_wall_seconds"], record["startup_seconds"]
            probes = record.get("probe_seconds")
        else:
            floor = json.loads(done.stdout.strip().splitlines()[-1])
            seconds, startup, probes = floor["seconds"], floor["startup_seconds"], None
    return {"tokens_per_sec": steps * size["batch"] * size["seq_len"] / seconds,
            "startup_seconds": startup, "probe_seconds": probes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("contender", choices=["floor"])
    parser.add_argument("--size", choices=list(SIZES), default="default")
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args(argv)
    print(json.dumps(floor_script(args.size, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
