"""The table a cost benchmark prints: a row per option, a column per (measure, length), each
cell the value with its ratio to the reference option's at that length (LRA Table 2's shape).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xformer_bench.results.table import Cell, Column, Row


@dataclass(frozen=True)
class Measure:
    attribute: str     # the point's field: "steps_per_sec", "peak_mb", "ms_per_token" ...
    key: str           # the column key's prefix
    title: str         # the column title, "{title} {axis}={length}"
    digits: int


def ratio_text(value: float | None, reference: float | None, digits: int) -> str | None:
    if value is None:
        return None
    ratio = f" ({value / reference:.2f}x)" if reference else ""
    return f"{value:.{digits}f}{ratio}"


def length_table(points: Sequence[Any], measures: Sequence[Measure], reference: str,
                 axis: str) -> tuple[tuple[Column, ...], tuple[Row, ...]]:
    """Columns and rows of ``points`` (each with ``attention``, ``length``, ``status`` and the
    measures' attributes); a point whose status is not "ok" shows its status."""
    lengths = sorted({p.length for p in points})
    names = list(dict.fromkeys(p.attention for p in points))
    at = {(p.attention, p.length): p for p in points}
    columns = tuple(Column(f"{m.key}_{n}", f"{m.title} {axis}={n}", kind="text")
                    for m in measures for n in lengths)
    rows = []
    for name in names:
        cells = []
        for m in measures:
            for n in lengths:
                p, ref = at.get((name, n)), at.get((reference, n))
                if p is None:
                    cells.append(Cell())
                elif p.status != "ok":
                    cells.append(Cell(text=p.status))
                else:
                    base = getattr(ref, m.attribute) if ref is not None and ref.status == "ok" \
                        else None
                    cells.append(Cell(text=ratio_text(getattr(p, m.attribute), base, m.digits)))
        rows.append(Row(label=name, key=(("attention", name),), cells=tuple(cells), finished=1,
                        total=1, statuses=""))
    return columns, tuple(rows)
