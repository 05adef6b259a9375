"""Find the run records under a results folder: load, validate, de-duplicate.

A file that is not a valid record (truncated JSON, missing keys, a malformed ``history``, a
``finished`` run without a finite primary metric) is reported and skipped; it never stops the
others from being read.  The folders of a results folder that hold no runs of it
(:data:`NOT_RUNS`: ``bench/``, the benchmarks' outputs; ``reference/``, the shipped studies,
each its own results folder, ``make references``; ``tables/``) are not descended into.  A JSON
object elsewhere with neither ``schema`` nor ``run_id`` is no run record at all: only counted
(``Collection.foreign``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from xformer_bench.results.record import (SCHEMA_VERSION, check_shapes, unmeasured, upgrade,
                                          validate)

NOT_RUNS = ("bench", "reference", "tables")
"""Folders directly under a results folder that hold none of its runs: benchmark outputs
(``scripts/bench_*.py``, ``results/bench``), the shipped references (``results/reference``,
rendered one by one by ``make references``) and the tables written there."""

TIMING_FILE = "timing.json"
"""A study's calibrated timing pass (:mod:`~xformer_bench.results.speed`), beside its records."""


@dataclass(frozen=True)
class Skipped:
    path: Path
    reason: str


class NotARecord(ValueError):
    """A JSON object that does not claim to be a run record (no ``schema``, no ``run_id``)."""


@dataclass
class Collection:
    records: list[dict[str, Any]] = field(default_factory=list)  # one per run_id, by run_id
    skipped: list[Skipped] = field(default_factory=list)
    duplicates: list[Path] = field(default_factory=list)         # older copies left out
    foreign: list[Path] = field(default_factory=list)            # JSON that is no run record

    def experiments(self) -> list[str]:
        return sorted({r["experiment"] for r in self.records})

    def of(self, experiment: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["experiment"] == experiment]


def record_paths(results_dir: Path, exclude: tuple[Path, ...] = ()) -> list[Path]:
    """Every ``*.json`` under ``results_dir`` not inside an excluded folder nor one of its
    :data:`NOT_RUNS` folders, in path order, less the calibrated timings beside the records
    (:data:`TIMING_FILE`: not a run)."""
    excluded = [p.resolve() for p in (*exclude, *(Path(results_dir) / n for n in NOT_RUNS))]
    paths = []
    for path in sorted(Path(results_dir).rglob("*.json")):
        resolved = path.resolve()
        if path.name == TIMING_FILE or any(resolved.is_relative_to(f) for f in excluded):
            continue
        paths.append(path)
    return paths


def read_record(path: Path) -> dict[str, Any]:
    """The record in ``path`` as schema 2; ``ValueError`` naming what is wrong otherwise."""
    try:
        payload = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"unreadable JSON ({error})") from error
    if not isinstance(payload, dict):
        raise ValueError(f"a JSON {type(payload).__name__}, not a run record")
    if "schema" not in payload and "run_id" not in payload:
        raise NotARecord("no schema, no run_id")
    payload = upgrade(payload)
    validate(payload)
    if payload["schema"] != SCHEMA_VERSION:
        raise ValueError(f"schema {payload['schema']!r}, this reader knows {SCHEMA_VERSION}")
    check_shapes(payload)
    check_history(payload.get("history") or [])
    missed = unmeasured(payload) if payload["status"] == "finished" else None
    if missed:
        raise ValueError(f"finished but {missed}")
    return payload


def check_history(history: list[Any]) -> None:
    """``ValueError`` naming the first validation point the curves cannot read: each is an
    object with a finite number ``step``."""
    for i, point in enumerate(history):
        step = point.get("step") if isinstance(point, dict) else None
        if (isinstance(step, bool) or not isinstance(step, (int, float))
                or not math.isfinite(step)):
            raise ValueError(f"'history' point {i} has step {step!r}, not a finite number"
                             if isinstance(point, dict) else
                             f"'history' point {i} is {point!r:.40}, not an object with a step")


def collect(results_dir: Path, exclude: tuple[Path, ...] = ()) -> Collection:
    """Read every record; for a run_id seen twice keep the newest ``finished_at``."""
    found = Collection()
    newest: dict[str, tuple[tuple[str, str], dict[str, Any], Path]] = {}
    for path in record_paths(results_dir, exclude):
        try:
            record = read_record(path)
        except NotARecord:
            found.foreign.append(path)
            continue
        except ValueError as error:
            found.skipped.append(Skipped(path, str(error)))
            continue
        rank = (str(record.get("finished_at") or ""), str(path))
        kept = newest.get(record["run_id"])
        if kept is None or rank > kept[0]:
            if kept is not None:
                found.duplicates.append(kept[2])
            newest[record["run_id"]] = (rank, record, path)
        else:
            found.duplicates.append(path)
    found.records = [newest[run_id][1] for run_id in sorted(newest)]
    found.duplicates.sort()
    return found
