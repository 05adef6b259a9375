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


def load_timing(results_dir: Path, experiment: str) -> dict[str, dict[str, Any]]:
    """The calibrated rows of ``experiment`` by :func:`row_identity`: every ``timing.json``
    under ``results_dir`` that names it, merged (the newest measurement of a row wins)."""
    found = []
    for path in Path(results_dir).rglob(TIMING_FILE):
        try:
            payload = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(payload, dict) and payload.get("experiment") == experiment:
            found.append(payload)
    rows: dict[str, dict[str, Any]] = {}
    for payload in sorted(found, key=lambda p: str(p.get("measured_at"))):
        settings = {k: payload.get(k) for k in ("repeats", "steps", "conditions")}
        rows.update({key: {**row, **settings} for key, row in payload.get("rows", {}).items()})
    return rows


def with_calibration(records: list[dict[str, Any]],
                     timing: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """``records``, each with its row's calibrated timing (:data:`CALIBRATED`) where measured."""
    calibrated = []
    for record in records:
        row = timing.get(row_identity(record["config"]))
        calibrated.append({**record, CALIBRATED: row} if row else record)
    return calibrated
