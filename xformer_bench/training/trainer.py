"""The lightning.Trainer for a run, from the ``trainer`` config group."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import Logger

from xformer_bench.hardware import resolve_precision
from xformer_bench.training.progress_lines import shows_bar
from xformer_bench.training.validation_schedule import validate_after, validation_steps


def build_trainer(trainer: dict, loggers: list[Logger], callbacks: list[L.Callback],
                  run_dir: Path) -> L.Trainer:
    """The Trainer of the config group, validating after the steps of
    :func:`~xformer_bench.training.validation_schedule.validation_steps`."""
    t = dict(trainer)
    accumulate = t["accumulate_grad_batches"]
    if t["checkpoint"]:  # after every validation, kept, plus last.ckpt: `resume=...` continues one
        callbacks = [*callbacks, ModelCheckpoint(
            dirpath=run_dir / "checkpoints", filename="step-{step}", auto_insert_metric_name=False,
            every_n_epochs=1, save_on_train_epoch_end=False, save_top_k=-1, save_last=True)]
    built = L.Trainer(
        accelerator=t["accelerator"],
        devices=t["devices"],
        num_nodes=t["num_nodes"],
        strategy=t["strategy"],
        precision=resolve_precision({"trainer": t})["trainer"]["precision"],
        max_steps=t["max_steps"],
        accumulate_grad_batches=accumulate,
        gradient_clip_val=t["gradient_clip_val"] or None,
        val_check_interval=accumulate,  # unread: validate_after below decides
        check_val_every_n_epoch=None,
        limit_val_batches=t["limit_val_batches"],
        num_sanity_val_steps=0,
        log_every_n_steps=t["log_every_n_steps"],
        enable_checkpointing=t["checkpoint"],
        enable_progress_bar=shows_bar(t["progress_bar"]),
        enable_model_summary=False,
        use_distributed_sampler=False,  # the datamodule shards by rank itself
        deterministic=t["deterministic"],
        logger=loggers,
        callbacks=callbacks,
        default_root_dir=str(run_dir),
    )
    validate_after(built, validation_steps(t["max_steps"], t["val_checks"]))
    return built
