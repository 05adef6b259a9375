"""A finished run's final weights, kept so ``xbench-sample RECORD`` needs no retraining.

When a run finishes (trained and tested), the model's tensors -- not the optimiser, the loops or
the callbacks -- are written to ``<paths.checkpoint_dir>/<experiment_name>/<run_id>/final.pt``
(:data:`FILENAME`), beside the run's resume points, and the record names the file
(``weights_path``).  The resume points are deleted then (:func:`~.checkpoints.discard` removes
``step-*.ckpt`` only, and the folder only when nothing else is in it), so the weights stay.

``trainer.keep_weights`` (outside the run id, like ``trainer.checkpoint``): ``auto`` (the
default) keeps them for a language model -- what ``xbench-sample`` samples -- of at most
:data:`AUTO_MAX_PARAMS` parameters; ``true`` for any run; ``false`` never.

The file is a plain ``torch.save`` of ``{"state_dict": {"model.<name>": tensor, ...}, "xbench":
{"format": 1, "record": {...}}}``: the model's entries of the LightningModule's state dict (the
keys a Lightning checkpoint has), and the record fields the sampler rebuilds the model from
(:data:`SAMPLER_FIELDS`, plain JSON types), so it loads with ``torch.load(weights_only=True)``
and the file alone is enough to sample from.  It is written to a temporary file and renamed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from xformer_bench.training.checkpoints import checkpoint_folder

FILENAME = "final.pt"
FORMAT = 1
AUTO_MAX_PARAMS = 50_000_000
"""``keep_weights=auto``: keep a language model's weights up to this many parameters (a file
of at most about 200 MB in float32): every shipped study's language model (4.5M parameters at
most; narang_base's 826K: 3.3 MB) is kept, while a sweep of paper-scale models (85M+ each, 340
MB a run) does not fill a disk unasked (``trainer.keep_weights=true`` keeps those too)."""
SAMPLER_FIELDS = ("run_id", "experiment", "task", "eval_unit", "layout", "config")
"""What ``xbench-sample`` reads of a record to rebuild and sample the model."""


def wanted(setting: Any, params: int | None, task: str | None) -> bool:
    """Whether ``trainer.keep_weights=setting`` keeps the weights of a model of ``params``
    parameters trained on ``task``."""
    if setting is True or setting is False:
        return setting
    return task == "lm" and params is not None and params <= AUTO_MAX_PARAMS


def weights_file(config: dict[str, Any], run_id: str) -> Path:
    """Where the final weights of ``run_id`` go."""
    return checkpoint_folder(config, run_id) / FILENAME


def keep_final_weights(config: dict[str, Any], record: dict[str, Any], trainer,
                       warn=print) -> str | None:
    """Write the finished run's final weights when ``trainer.keep_weights`` asks for them; the
    path written (for the record's ``weights_path``), else None.  Every rank calls it (FSDP
    gathers the full state dict), rank zero writes.  A write that fails (a full disk) is a
    warning line, not a failed run: the record is the result."""
    if not wanted(config["trainer"].get("keep_weights", "auto"), record.get("params"),
                  record.get("task")):
        return None
    state = trainer.strategy.lightning_module_state_dict()
    if not trainer.is_global_zero:
        return None
    path = weights_file(config, record["run_id"])
    fields = json.loads(json.dumps({k: record.get(k) for k in SAMPLER_FIELDS}, default=str))
    payload = {"state_dict": {k: v.detach().cpu() for k, v in state.items()
                              if k.startswith("model.")},
               "xbench": {"format": FORMAT, "record": fields}}
    try:
        _save_atomic(payload, path)
    except OSError as error:
        warn(f"[xbench] warning: final weights not kept ({path}: {error.strerror or error}); "
             "the record is written without them")
        return None
    return str(path)


def _save_atomic(payload: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".final-", suffix=".tmp")
    os.close(handle)
    try:
        torch.save(payload, temporary)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
