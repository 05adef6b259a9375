"""Experiment loggers selected by ``logger=``: local CSV by default, nothing needs an account."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, WandbLogger

KINDS = ("csv", "wandb", "none")


def build_loggers(spec: dict, run_dir: Path, record: dict[str, Any]) -> list[Logger]:
    """The loggers of one run; ``record`` (run id, experiment, choices, config) names the run."""
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
    """End what must not outlive the run: a W&B run stays open until finished."""
    if any(isinstance(logger, WandbLogger) for logger in loggers):
        from xformer_bench.training.wandb_logger import finish

        finish(failed)
