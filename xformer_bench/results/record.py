"""The run record: one JSON file per run, written atomically, read by ``make table``.

Its identity (``run_id``) is a hash of what the resolved configuration computes (each key's
declaration says whether it does: :mod:`xformer_bench.schema.identity`), so re-running the same
configuration -- with or without a progress bar or checkpoints -- replaces its record instead of
adding a second one.

Schema 2 records say what their task measured: ``task``, ``metrics`` (the task's
:class:`MetricSpec` s, primary first), ``primary_metric``, ``eval_unit`` and ``eval_counts``
(units evaluated per split).  Schema 1 records (byte-level language modelling only, with
``eval_bytes``) are read as schema 2 by :func:`upgrade`.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import tempfile
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from xformer_bench.metric_spec import BITS_PER, MetricSpec
from xformer_bench.schema.identity import computing_part, outside_identity

SCHEMA_VERSION = 2
STATUSES = ("finished", "diverged", "failed", "interrupted")
"""``finished`` only when the run measured what it promised (:func:`unmeasured`); tables average
finished runs only."""
IDENTITY_EXCLUDED = tuple(k for k, keys in outside_identity().items() if keys is None)
"""Top-level keys and groups wholly outside the run id: each declaration says whether its key
changes what a run computes (:mod:`xformer_bench.schema.identity`) -- where files go, how the
run is shown, logged, checkpointed and resumed, and a study's declarations (its sweep, baseline,
parameter-matching request: the widths the match solves are in ``model`` and count there; the
published table beside it; the ladder rung or paper row a run was made for: their overrides are
in the run's own config; the settings it gives one option of a group: those are in that
option's config)."""

IDENTITY_NEUTRAL = {
    "model": {"residual": "add", "residual_attention": False, "checkpointing": False,
              "pool": "cls", "patch_size": 4, "tie_encoder_embedding": True},
    "eval": {"stride": None, "beam": 4, "length_penalty": 0.6, "max_extra_len": 50,
             "tgt_len": None, "lanes": None, "warm": False, "val_bleu": "last"},
    "optim": {"label_smoothing": 0.1},
    "stack": {"name": "standard", "label": "Standard stack"},
    "embedding": {"name": "lookup", "label": "Lookup embedding"},
    "head": {"name": "softmax", "label": "Softmax", "tie": True},
    "trainer": {"compile": False},
    "data": {"resize": "crop", "crop_scale": [0.08, 1.0], "crop_ratio": [0.75, 4 / 3],
             "flip": 0.5,  # data=imagenet's augmentation keys
             "val_subsample": None},
}
"""Keys added after records existed, at the value that trains what runs did before they
existed: left out of the hash at that value, so older records keep their ids (and a study
resumes) when the house grows an option."""

IDENTITY_RETIRED = {"model": {"tie_embeddings": True, "embedding_dim": None, "output": "softmax",
                              "mos_components": 4}}
"""Keys removed from the config (these four became the ``embedding`` and ``head`` groups),
hashed at the value the records from before their removal had, so that those records'
configurations keep their ids (a record's own config, which still has them, hashes as it did)."""

GROUPS_ADDED = {"stack": "standard", "embedding": "lookup", "head": "softmax"}
"""Config groups added after records existed, with the option those records ran: read into
their ``choices`` (:func:`upgrade`), so old and new runs of one configuration share a row."""

REQUIRED_KEYS = (
    "schema", "run_id", "experiment", "status", "error", "choices", "overrides", "seed",
    "git_commit", "params", "active_params", "flops_per_step", "steps_per_sec", "tokens_per_sec",
    "peak_memory_mb", "peak_memory_kind", "early", "final", "test", "task", "metrics",
    "primary_metric", "eval_unit", "eval_counts", "steps", "wall_time_sec", "config",
)
OPTIONAL_KEYS = ("weights_path", "device")
"""Keys a record may lack (written before they existed): ``weights_path``, the run's final
weights when it kept them (``trainer.keep_weights``: :mod:`xformer_bench.training.final_weights`),
read by ``xbench-sample``; None when it kept none.  ``device``: what it trained on, the GPU's
name or ``cpu`` (:func:`xformer_bench.hardware.trained_on`)."""
TASK_KEYS = ("task", "metrics", "primary_metric", "eval_unit")
"""Keys the task fills once built (:func:`task_fields`); None (metrics: []) until then."""


MEASURED = ("params", "active_params", "flops_per_step", "steps_per_sec", "tokens_per_sec",
            "peak_memory_mb", "peak_memory_kind", "early", "final", "test", "wall_time_sec")
"""Keys a run fills as it goes; None until measured."""

PER_RUN_MEMORY = ("cuda_max_allocated",)
"""``peak_memory_kind`` s that tables show as a run's memory.  A CPU resident set, even reset
per run (``cpu_peak_rss``), carries the interpreter, the data and what earlier runs of a sweep
left cached; ``cpu_max_rss`` is the process's peak since it started.  On every machine the
table shows ``step_memory_mb`` instead (:mod:`xformer_bench.training.step_memory`)."""

SHAPES = {"run_id": str, "experiment": str, "choices": dict, "config": dict, "overrides": list,
          "early": (dict, type(None)), "final": (dict, type(None)), "test": (dict, type(None)),
          "history": (list, type(None)), "metrics": list}
"""What the tables read, beyond the keys' presence."""


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_record(config: dict[str, Any], choices: dict[str, Any], overrides: list[str],
               run_dir: Path) -> dict[str, Any]:
    """The record of a run about to start: every required key, the outcome not yet known
    (``failed`` until the run says otherwise, so a crash still leaves a truthful record)."""
    return {
        "schema": SCHEMA_VERSION, "run_id": run_identity(config, choices),
        "experiment": config["experiment_name"], "status": "failed", "error": None,
        "choices": choices, "overrides": list(overrides), "seed": config["seed"],
        "git_commit": git_commit(), **dict.fromkeys(MEASURED), **dict.fromkeys(TASK_KEYS),
        "metrics": [], "eval_counts": {}, "flops_analytic": {}, "flops_uncounted": [],
        "model_report": {}, "steps": 0,
        "config": config, "run_dir": str(run_dir), "started_at": now(),
        "weights_path": None,  # optional (older records lack it): the kept final weights
    }


def task_fields(task: str, metrics: Sequence[MetricSpec], unit: str) -> dict[str, Any]:
    """What a record says of its task: its name, metric specs (the first is the primary one)
    and the unit its evaluation counts."""
    return {"task": task, "metrics": [m.as_record() for m in metrics],
            "primary_metric": metrics[0].name, "eval_unit": unit}


def unmeasured(record: dict[str, Any]) -> str | None:
    """Why a run that trained to its end did not measure what it promised -- it took fewer or
    more optimiser steps than ``trainer.max_steps``, or its primary metric's final validation
    or test value is missing or not finite -- else None (it may be recorded ``finished``)."""
    asked = (record.get("config") or {}).get("trainer", {}).get("max_steps")
    if record.get("steps") != asked:
        return f"it took {record.get('steps')} optimiser steps of trainer.max_steps={asked}"
    spec = primary_metric(record)
    if spec is None:
        return "its task named no primary metric"
    for split, values in (("val", record.get("final")), ("test", record.get("test"))):
        if split == "val" and (record.get("decoding") or {}).get("val") == "none":
            continue  # translation with eval.val_bleu=never: BLEU at the test only
        value = (values or {}).get(spec.key(split))
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            what = "final validation" if split == "val" else "test"
            return f"its {what} {spec.name} is {'missing' if value is None else value}"
    return None


def primary_metric(record: dict[str, Any]) -> MetricSpec | None:
    """The spec of the record's primary metric; None before its task was built."""
    specs = [MetricSpec.from_record(s) for s in record.get("metrics") or []]
    return next((s for s in specs if s.name == record.get("primary_metric")), None)


def upgrade(record: dict[str, Any]) -> dict[str, Any]:
    """A record as schema 2, the one conversion of older records on read.

    A record from before a config group existed (:data:`GROUPS_ADDED`) gets that group's
    option in its ``choices``.  Schema 1 was written by byte-level language modelling only: its task is ``lm``, its one
    metric bits per byte, and its ``eval_bytes`` the evaluated units.  Any other record is
    returned as it is (:func:`validate` and the schema check judge it).
    """
    choices = record.get("choices")
    if isinstance(choices, dict) and any(g not in choices for g in GROUPS_ADDED):
        record = {**record, "choices": {**GROUPS_ADDED, **choices}}
    if record.get("schema") != 1:
        return record
    upgraded = {k: v for k, v in record.items() if k != "eval_bytes"}
    upgraded.update(schema=SCHEMA_VERSION, **task_fields("lm", [BITS_PER["bytes"]], "bytes"))
    if "eval_bytes" in record:
        upgraded["eval_counts"] = record["eval_bytes"]
    return upgraded


def identity_config(config: dict[str, Any]) -> dict[str, Any]:
    """The part of ``config`` that changes the result: what the run id hashes (and what a
    checkpoint carries, to refuse resuming another configuration)."""
    essential = computing_part(config)
    for group, neutral in IDENTITY_NEUTRAL.items():
        if isinstance(essential.get(group), dict):
            essential[group] = {k: v for k, v in essential[group].items()
                                if k not in neutral or v != neutral[k]}
            if not essential[group]:
                del essential[group]  # a node of neutral keys only: as if it did not exist
    for group, retired in IDENTITY_RETIRED.items():
        if isinstance(essential.get(group), dict):
            essential[group] = {**retired, **essential[group]}
    return essential


def run_identity(config: dict[str, Any], choices: dict[str, str]) -> str:
    """Readable prefix + hash of everything that changes the result."""
    essential = identity_config(config)
    digest = hashlib.sha1(json.dumps(essential, sort_keys=True, default=str).encode()).hexdigest()
    parts = [choices.get(g, "") for g in ("model", "attention", "norm", "activation", "position")]
    return f"{'-'.join(p for p in parts if p)}_s{config.get('seed')}_{digest[:10]}"


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD of the xbench checkout, suffixed ``+dirty`` when it has uncommitted changes."""
    here = cwd or Path(__file__).resolve().parent
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def write_json_atomic(path: Path, payload: dict[str, Any]) -> Path:
    """Write to a temporary file in the same folder, then rename: readers never see half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f, indent=2, sort_keys=True, default=str, allow_nan=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def validate(record: dict[str, Any]) -> None:
    """``ValueError`` naming a missing key or an unknown status."""
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"run record lacks {missing}")
    if record["status"] not in STATUSES:
        raise ValueError(f"run record status {record['status']!r} not in {STATUSES}")


def check_shapes(record: dict[str, Any]) -> None:
    """``ValueError`` naming a key whose value the tables cannot read (:data:`SHAPES`)."""
    for key, kinds in SHAPES.items():
        if not isinstance(record.get(key), kinds):
            raise ValueError(f"{key!r} is a {type(record.get(key)).__name__}")
    for spec in record["metrics"]:
        MetricSpec.from_record(spec)


def load(path: Path) -> dict[str, Any]:
    """The record in ``path``, as schema 2 (:func:`upgrade`); ``ValueError`` for a file that is
    not one (not JSON, not an object, a required key missing)."""
    payload = json.loads(Path(path).read_text())
    if not isinstance(payload, dict):
        raise ValueError(f"it holds a JSON {type(payload).__name__}, not a run record (an object)")
    record = upgrade(payload)
    validate(record)
    return record


def results_path(config: dict[str, Any], run_id: str) -> Path:
    """Where the record of ``run_id`` goes: ``<results_dir>/<experiment_name>/<run_id>.json``."""
    return Path(config["paths"]["results_dir"]) / config["experiment_name"] / f"{run_id}.json"


def finished_record(config: dict[str, Any], choices: dict[str, str]) -> dict[str, Any] | None:
    """The record of this configuration if it already ran to the end, else None.

    Diverged, failed and interrupted runs count as not done; so does a file at the record's
    path that is not this run's record -- unreadable, or another run's (its own ``run_id``, or
    the id its own config hashes to, is not the path's: a record copied or edited there would
    otherwise put another run's number in this run's row).  Such a file is named in one line;
    the run then replaces it.
    """
    run_id = run_identity(config, choices)
    path = results_path(config, run_id)
    if not path.exists():
        return None
    try:
        record = load(path)
        own = run_identity(record["config"], record["choices"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
        print(f"[xbench] not trusted: {path} ({error}); running {run_id} again")
        return None
    if record["run_id"] != run_id or own != run_id:
        other = record["run_id"] if record["run_id"] != run_id else own
        print(f"[xbench] not trusted: {path} is the record of {other}, not {run_id}; "
              "running it again")
        return None
    return record if record["status"] == "finished" else None


def write_record(record: dict[str, Any], config: dict[str, Any]) -> Path:
    """Rank zero writes the record to the run directory and to results/<experiment>/."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    path = results_path(config, record["run_id"])
    if rank_zero_only.rank == 0:
        validate(record)
        write_json_atomic(Path(record["run_dir"]) / "record.json", record)
        write_json_atomic(path, record)
    return path
