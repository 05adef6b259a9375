"""A :class:`Table` as CSV: full-precision numbers, a mean and a std column per measure, and
per metric the uncorrected p-value against the baseline row (the marks are Holm-corrected)."""

from __future__ import annotations

import csv
import io

from xformer_bench.results.confounds import summary, undeclared
from xformer_bench.results.table import Column, Table


def render(table: Table) -> str:
    facets = list(dict.fromkeys(name for row in table.rows for name, _ in row.key))
    numeric = [c for c in table.columns if c.kind != "text"]
    header = ["variant", *facets, *(k for c in numeric for k in _names(c)),
              "seeds_finished", "seeds_total", "statuses", *_extra_names(table)]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in table.rows:
        key = dict(row.key)
        cells = {c.key: cell for c, cell in zip(table.columns, row.cells)}
        values = [_number(getattr(cells[c.key], field))
                  for c in numeric for field in ("mean", "std", "p_value")[:len(_names(c))]]
        writer.writerow([row.label, *(key.get(f, "") for f in facets), *values,
                         row.finished, row.total, row.statuses, *_extras(table, row)])
    return out.getvalue()


def _extra_names(table: Table) -> list[str]:
    """The eval protocol column when rows differ in it; the confounds when a baseline is."""
    protocol = any(c.key == "eval_protocol" for c in table.columns)
    return (["eval_protocol"] if protocol else []) + (
        ["differences_from_baseline", "undeclared_differences"] if table.baseline else [])


def _extras(table: Table, row) -> list[str]:
    cells = {c.key: cell for c, cell in zip(table.columns, row.cells)}
    protocol = [cells["eval_protocol"].text or ""] if "eval_protocol" in cells else []
    found = list(row.differences)
    return protocol + ([summary(found, limit=None), ";".join(undeclared(found))]
                       if table.baseline else [])


def _names(column: Column) -> tuple[str, ...]:
    """A measured column has a mean and a std, a metric also its uncorrected p-value against
    the baseline row (empty without one); a configuration property (si) one value."""
    if column.kind == "si":
        return (column.key,)
    if column.higher_is_better is None:
        return (column.key, f"{column.key}_std")
    return (column.key, f"{column.key}_std", f"{column.key}_p")


def _number(value: float | None) -> str:
    return "" if value is None else repr(value)
