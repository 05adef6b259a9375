"""The run record: one JSON file per run, written atomically, read by ``make table``.

Its identity (``run_id``) is a hash of the resolved configuration less where files live and
how the run is logged, so re-running the same configuration replaces its record instead of
adding a second one.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("finished", "diverged", "failed", "interrupted")
IDENTITY_EXCLUDED = ("paths", "logger", "resume", "skip_completed")

REQUIRED_KEYS = (
    "schema", "run_id", "experiment", "status", "error", "choices", "overrides", "seed",
    "git_commit", "params", "active_params", "flops_per_step", "steps_per_sec", "tokens_per_sec",
    "peak_memory_mb", "peak_memory_kind", "early", "final", "test", "eval_bytes", "steps",
    "wall_time_sec", "config",
)


def run_identity(config: dict[str, Any], choices: dict[str, str]) -> str:
    """Readable prefix + hash of everything that changes the result."""
    essential = {k: v for k, v in config.items() if k not in IDENTITY_EXCLUDED}
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
    missing = [k for k in REQUIRED_KEYS if k not in record]
    if missing:
        raise ValueError(f"run record lacks {missing}")
    if record["status"] not in STATUSES:
        raise ValueError(f"run record status {record['status']!r} not in {STATUSES}")


def load(path: Path) -> dict[str, Any]:
    record = json.loads(Path(path).read_text())
    validate(record)
    return record
