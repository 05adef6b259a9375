"""A guard on the shipped references (``results/reference/<name>/records/``): each records the
numbers its baseline row measured (``results/reference/<name>/expected.json``: per study, the
baseline row's mean and seed std of every metric column), written by ``make table`` when
absent; afterwards ``make table`` warns when the baseline row moved from them by more than its
noise floor (the shipped seed std), so a code change that silently shifts results is seen.
Delete the file (or the study's entry) to accept a deliberate change.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xformer_bench.results.record import write_json_atomic
from xformer_bench.results.table import Table

RECORDS_FOLDER = "records"
EXPECTED_FILE = "expected.json"


def expected_path(results_dir: Path) -> Path | None:
    """``<reference>/expected.json`` when ``results_dir`` is a shipped reference's records
    folder, else None (a results folder of one's own runs has nothing to keep)."""
    results_dir = Path(results_dir)
    return results_dir.parent / EXPECTED_FILE if results_dir.name == RECORDS_FOLDER else None


def baseline_numbers(table: Table) -> dict[str, Any]:
    """The baseline row's label and, per metric column, its mean and seed std."""
    row = next((r for r in table.rows if r.label == table.baseline), None)
    if row is None:
        return {}
    metrics = {column.key: {"title": column.title, "mean": cell.mean, "std": cell.std}
               for column, cell in zip(table.columns, row.cells)
               if column.higher_is_better is not None and cell.mean is not None}
    return {"baseline": row.label, "metrics": metrics}


def shifts(table: Table, shipped: dict[str, Any]) -> list[str]:
    """A sentence per metric whose baseline value moved by more than the shipped std."""
    now = baseline_numbers(table).get("metrics", {})
    moved = []
    for key, then in shipped.get("metrics", {}).items():
        if key not in now:
            continue
        change, floor = now[key]["mean"] - then["mean"], then.get("std") or 0.0
        if abs(change) > floor:
            moved.append(f"{table.experiment}: the baseline row ({shipped.get('baseline')}) "
                         f"moved on {then['title']}: {now[key]['mean']:.4g} against the shipped "
                         f"{then['mean']:.4g} ({change:+.3g}; noise floor {floor:.3g})")
    return moved


def guard(table: Table, path: Path) -> tuple[list[str], bool]:
    """The shifts of ``table``'s baseline row against ``path``, and whether ``path`` was
    written (the study's numbers recorded there for the first time)."""
    expected = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    if table.experiment in expected:
        return shifts(table, expected[table.experiment]), False
    numbers = baseline_numbers(table)
    if not numbers:
        return [], False
    write_json_atomic(path, {**expected, table.experiment: numbers})
    return [], True
