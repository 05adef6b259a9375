"""Resume points of a run, found again by its run id: ``resume=auto`` continues from them.

A run with ``resume=auto`` (studies set it) keeps its resume points in
``<paths.checkpoint_dir>/<experiment>/<run_id>/step-NNNNNNNN.ckpt``: one after each
validation and one every ``trainer.checkpoint_every`` optimiser steps, written to a
temporary file and renamed (a reader never sees half a file), the last :data:`KEEP` kept.  On
start, the newest one that loads is resumed; a truncated or corrupt one is skipped with a
warning line (the previous one is used).  A checkpoint carries the run id and the resolved
configuration it was written by, so ``resume=PATH`` to another configuration's checkpoint is a
one-line error naming the first key that differs, and to a file that is no xbench checkpoint (a
text file, a plain ``torch.save``) one naming what it lacks -- both before anything trains.
When the run finishes its resume points are deleted (its record is the result; its final
weights, ``final.pt``, stay for sampling: :mod:`xformer_bench.training.final_weights`).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import lightning as L
import torch

from xformer_bench.errors import ConfigError, DivergedError

KEEP = 2
"""Resume points kept per run: the newest and the one before (if the newest is cut short)."""
PATTERN = "step-*.ckpt"


def checkpoint_folder(config: dict[str, Any], run_id: str) -> Path:
    """Where the resume points of ``run_id`` live."""
    root = Path(config["paths"].get("checkpoint_dir") or
                Path(config["paths"]["results_dir"]) / "checkpoints")
    return root / config["experiment_name"] / run_id


def resume_points(folder: Path) -> list[Path]:
    """The folder's checkpoints, newest first."""
    return sorted(folder.glob(PATTERN), reverse=True) if folder.is_dir() else []


def _load(path: Path) -> dict[str, Any]:
    return torch.load(path, map_location="cpu", weights_only=True)


def latest_valid(folder: Path, warn=print) -> Path | None:
    """The newest checkpoint in ``folder`` that loads; each unreadable one is a warning line."""
    for path in resume_points(folder):
        try:
            _load(path)
        except Exception as error:  # noqa: BLE001 -- any reason a file does not load
            warn(f"[xbench] warning: skipped checkpoint {path}: unreadable "
                 f"({type(error).__name__}); using the one before")
            continue
        return path
    return None


def _first_difference(a: Any, b: Any, prefix: str = "") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            found = _first_difference(a.get(key), b.get(key), f"{prefix}{key}.")
            if found:
                return found
        return None
    return None if a == b else f"{prefix.rstrip('.')}: {a!r} there, {b!r} here"


GIVE = "give a .ckpt an xbench run wrote, resume=auto (this run's own latest) or drop resume="
LIGHTNING_KEYS = ("pytorch-lightning_version", "state_dict")


def written_identity(path: Path) -> dict[str, Any]:
    """The identity the xbench checkpoint ``path`` carries; a ConfigError naming the file and
    what it lacks when it does not load, is no Lightning checkpoint or no xbench run's."""
    try:
        state = _load(path)
    except Exception as error:  # noqa: BLE001 -- any reason a file does not load
        reason = f"{type(error).__name__}: {error}".splitlines()[0].split(". ")[0][:100]
        raise ConfigError(f"resume={path}: not a checkpoint torch can load ({reason}); "
                          f"{GIVE}") from None
    missing = [k for k in LIGHTNING_KEYS if not isinstance(state, dict) or k not in state]
    if missing:
        raise ConfigError(f"resume={path} is not a Lightning checkpoint (no {missing[0]}: a "
                          f"plain torch.save?); {GIVE}")
    stamp = state.get("xbench")
    identity = stamp.get("identity") if isinstance(stamp, dict) else None
    if not isinstance(identity, dict):
        raise ConfigError(f"resume={path} is a Lightning checkpoint but no xbench run's (it "
                          f"carries no xbench identity); {GIVE}")
    return identity


def resume_path(config: dict[str, Any], run_id: str, identity: dict[str, Any],
                warn=print) -> str | None:
    """The checkpoint this run continues from: ``resume=auto`` its own newest valid one (or
    None: a fresh start), ``resume=PATH`` that file if it was written by this configuration."""
    resume = config.get("resume")
    if resume in (None, "", "null"):
        return None
    if resume == "auto":
        found = latest_valid(checkpoint_folder(config, run_id), warn)
        if found is not None:
            warn(f"[xbench] resuming {run_id} from {found}")
        return None if found is None else str(found)
    path = Path(resume)
    if not path.is_file():
        raise ConfigError(f"resume={resume}: no such checkpoint; {GIVE}")
    theirs = written_identity(path)
    if theirs != identity:
        raise ConfigError(f"resume={resume} was written by another configuration "
                          f"({_first_difference(theirs, identity)}); run with its settings "
                          "or drop resume=")
    return str(path)


class RunCheckpoints(L.Callback):
    """Writes the resume points (see the module docstring) and stamps every checkpoint the
    run saves with its identity."""

    def __init__(self, folder: Path, periodic: bool, every: int | None,
                 validation_steps: list[int], identity: dict[str, Any]):
        self.folder, self.periodic = folder, periodic
        self.every, self.validation_steps = every, frozenset(validation_steps)
        self.identity = json.loads(json.dumps(identity, default=str))  # plain types only

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        checkpoint["xbench"] = {"identity": self.identity}

    def validates_at(self, step: int) -> bool:
        """Whether a validation follows optimiser step ``step``."""
        return step in self.validation_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        """Every ``checkpoint_every`` steps -- unless a validation follows: a point saved before
        it would resume after it (Lightning does not validate again), so that point is saved
        when the validation ends."""
        step = trainer.global_step
        if (not self.periodic or self.every is None or step % self.every
                or (batch_idx + 1) % trainer.accumulate_grad_batches
                or self.validates_at(step)):
            return
        self.save(trainer)

    def on_validation_end(self, trainer, pl_module) -> None:
        if self.periodic and not trainer.sanity_checking and trainer.global_step < trainer.max_steps:
            self.save(trainer)

    def save(self, trainer) -> Path:
        """Write ``step-<global_step>.ckpt`` atomically and prune to :data:`KEEP` -- only
        finite parameters: a run whose loss went NaN between two checks stops as diverged
        here, and its last point stays a good one."""
        if not all(bool(torch.isfinite(p).all()) for p in trainer.lightning_module.parameters()):
            raise DivergedError(f"parameters are NaN or infinite at step {trainer.global_step}; "
                                "lower optim.lr or raise optim.warmup_steps")
        path = self.folder / f"step-{trainer.global_step:08d}.ckpt"
        if trainer.is_global_zero:
            self.folder.mkdir(parents=True, exist_ok=True)
            for leftover in self.folder.glob(".step-*.tmp"):  # a write a kill cut short
                leftover.unlink(missing_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.folder, prefix=".step-", suffix=".tmp") \
            if trainer.is_global_zero else (None, None)
        if handle is not None:
            os.close(handle)
        # every rank takes part, rank zero writes; the whole state (loops, callbacks, optimiser)
        trainer.save_checkpoint(temporary or path, weights_only=False)
        if trainer.is_global_zero:
            os.replace(temporary, path)
            for old in resume_points(self.folder)[KEEP:]:
                old.unlink(missing_ok=True)
        return path


def discard(folder: Path) -> None:
    """Remove a finished run's resume points (and the folder if nothing else is in it)."""
    if folder.is_dir():
        for path in [*folder.glob(PATTERN), *folder.glob(".step-*.tmp")]:
            path.unlink(missing_ok=True)
        if not any(folder.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)
