"""Experiment loggers selected by ``logger=``: local CSV by default, nothing needs an account."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning.pytorch.loggers import Logger

KINDS = ("csv", "wandb", "none")


def build_loggers(spec: dict, run_dir: Path, record: dict[str, Any]) -> list[Logger]:
    """The loggers of one run; ``record`` (run id, experiment, choices, config) names the run."""
    from lightning.pytorch.loggers import CSVLogger

    kind = spec["name"]
    if kind == "csv":
        return [CSVLogger(save_dir=str(run_dir), name="logs", version="")]
    if kind == "wandb":
        from xformer_bench.training.wandb_logger import build_wandb_logger

        return [build_wandb_logger(spec, run_dir, record)]
    if kind == "none":
        return []
    raise ValueError(f"unknown logger '{kind}'; choose one of: {', '.join(KINDS)}")


def close_loggers(loggers: list[Logger], failed: bool) -> None:
    """Training is over.  Nothing closes yet: a W&B run stays open until the record knows the
    run's outcome (:func:`finish_logging`)."""


def finish_logging(record: dict[str, Any]) -> None:
    """Close what must not outlive the run, once its record says how it ended: a W&B run gets
    the record's headline numbers in its summary, then is finished."""
    if "wandb" in sys.modules:  # only a run that logged to W&B imported it
        from xformer_bench.training.wandb_logger import finish

        finish(record)
