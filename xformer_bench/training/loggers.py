"""Experiment loggers selected by ``logger=``: local CSV by default, nothing needs an account."""

from __future__ import annotations

from pathlib import Path

from lightning.pytorch.loggers import CSVLogger, Logger


def build_loggers(spec: dict, run_dir: Path) -> list[Logger]:
    kind = spec["name"]
    if kind == "csv":
        return [CSVLogger(save_dir=str(run_dir), name="logs", version="")]
    if kind == "none":
        return []
    raise ValueError(f"unknown logger '{kind}'; choose one of: csv, none")
