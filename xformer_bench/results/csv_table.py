"""A :class:`Table` as CSV: full-precision numbers, a mean and a std column per measure, and
per metric the uncorrected p-value against the baseline row (the marks are Holm-corrected);
with a paper beside the measurement, each Paper column's value, printed std and agreement, and
its summary lines as trailing ``# `` comment lines (``pandas.read_csv(..., comment="#")``)."""

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
                  for c in numeric for _, field in _fields(c)]
        writer.writerow([row.label, *(key.get(f, "") for f in facets), *values,
                         row.finished, row.total, row.statuses, *_extras(table, row)])
    return out.getvalue() + "".join(f"# {line}\n" for line in table.summary)


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


def _fields(column: Column) -> tuple[tuple[str, str], ...]:
    """(name suffix, cell field) of a column's CSV columns: a measured column has a mean and a
    std, a metric also its uncorrected p-value against the baseline row (empty without one),
    a Paper column its agreement with the measurement; a configuration property (si) one
    value."""
    if column.kind == "si":
        return (("", "mean"),)
    if column.kind == "paper":
        return ("", "mean"), ("_std", "std"), ("_agreement", "agreement")
    if column.higher_is_better is None:
        return ("", "mean"), ("_std", "std")
    return ("", "mean"), ("_std", "std"), ("_p", "p_value")


def _names(column: Column) -> tuple[str, ...]:
    return tuple(column.key + suffix for suffix, _ in _fields(column))


def _number(value: float | str | None) -> str:
    return "" if value is None else value if isinstance(value, str) else repr(value)
