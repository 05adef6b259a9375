"""The calibrated speed of a study's rows, as the table reads it.

A run's own steps/s carries whatever else shared the machine while it trained (its record's
``timing_conditions``).  The calibrated timing pass
(:mod:`xformer_bench.bench.row_timing`, ``make time-rows``) times each row -- each distinct
configuration less its seed, :func:`row_identity` -- under control and writes
``timing.json`` (:data:`~xformer_bench.results.collect.TIMING_FILE`) beside the study's
records.  ``make table`` gives each record its row's entry (:func:`with_calibration`), and the
Step/s column (:mod:`~xformer_bench.results.columns`) takes the speed from it where it exists.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xformer_bench.results.collect import TIMING_FILE
from xformer_bench.results.record import run_identity

CALIBRATED = "calibrated_speed"
"""The key :func:`with_calibration` gives a record: its row's entry of ``timing.json``, with
the pass's ``repeats``, ``steps`` and ``conditions``."""


def row_identity(config: dict[str, Any]) -> str:
    """The run identity less the seed: what the seeds of one row share."""
    return run_identity({**config, "seed": None}, {}).rsplit("_", 1)[1]


def check_timing(payload: Any) -> None:
    """``ValueError`` naming what of a timing pass the table cannot read: an object with an
    ``experiment`` name and ``rows``, each with a finite ``steps_per_sec`` and ``iqr`` and its
    ``rates``; ``conditions``, if any, an object."""
    if not isinstance(payload, dict):
        raise ValueError(f"a JSON {type(payload).__name__}, not a timing pass")
    if not (isinstance(payload.get("experiment"), str) and isinstance(payload.get("rows"), dict)):
        raise ValueError("no 'experiment' name or no 'rows' object")
    if not isinstance(payload.get("conditions"), (dict, type(None))):
        raise ValueError(f"'conditions' is a {type(payload['conditions']).__name__}")
    for key, row in payload["rows"].items():
        numbers = [row.get(k) for k in ("steps_per_sec", "iqr")] if isinstance(row, dict) else []
        if not (numbers and all(isinstance(n, (int, float)) and not isinstance(n, bool)
                                and math.isfinite(n) for n in numbers)
                and isinstance(row.get("rates"), list)):
            raise ValueError(f"row {key!r} lacks a finite steps_per_sec, iqr or its rates")


def load_timings(results_dir: Path, log: Callable[[str], None],
                 exclude: tuple[Path, ...] = ()) -> dict[str, dict[str, dict[str, Any]]]:
    """Per experiment, its calibrated rows by :func:`row_identity`: every ``timing.json``
    under ``results_dir`` (less the ``exclude`` d folders) that names it, merged (the newest
    measurement of a row wins).  One that cannot be read is named in one ``log`` line and
    left out: its rows' Step/s comes from their runs."""
    excluded = [p.resolve() for p in exclude]
    found = []
    for path in sorted(Path(results_dir).rglob(TIMING_FILE)):
        if any(path.resolve().is_relative_to(f) for f in excluded):
            continue
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
            check_timing(payload)
        except (OSError, UnicodeDecodeError, ValueError) as error:
            reason = (f"unreadable JSON ({error})" if isinstance(error, json.JSONDecodeError)
                      else str(error))
            log(f"skipped {path}: {reason}; Step/s from the runs' own timings")
            continue
        found.append(payload)
    by_experiment: dict[str, dict[str, dict[str, Any]]] = {}
    for payload in sorted(found, key=lambda p: str(p.get("measured_at"))):
        settings = {k: payload.get(k) for k in ("repeats", "steps", "conditions")}
        by_experiment.setdefault(payload["experiment"], {}).update(
            {key: {**row, **settings} for key, row in payload["rows"].items()})
    return by_experiment


def with_calibration(records: list[dict[str, Any]],
                     timing: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``records``, each with its row's calibrated timing (:data:`CALIBRATED`) where measured."""
    calibrated = []
    for record in records:
        row = timing.get(row_identity(record["config"]))
        calibrated.append({**record, CALIBRATED: row} if row else record)
    return calibrated
