"""The paper beside the measurement: for a study that declares ``reference: <table>`` (a
shipped table, :mod:`xformer_bench.references`), a "Paper" column after each measured column
the table maps to one of the paper's (its ``measures``: final loss <-> final loss, bpb <-> the
paper's loss, BLEU <-> BLEU, Step/s <-> Step/s as a ratio to the baseline row), each row's
agreement with the paper on the sign of its change against the baseline row, and the summary
lines: Spearman's rho and Kendall's tau-b between the measured and the published ordering of
the rows, with a bootstrap interval over seeds (:mod:`paper`).

A row is the paper's row its runs were made for (``paper_row``: a study whose rows are the
paper's), else the paper's row whose override list holds in every one of its runs (the most
specific when several do); the study's baseline row is the paper's baseline row.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import yaml

from xformer_bench.references import ReferenceRow, ReferenceTable
from xformer_bench.results import paper
from xformer_bench.results.columns import ColumnSpec, Runs
from xformer_bench.results.table import Cell, Column, Row
from xformer_bench.results.variants import paper_label

SUFFIX = "_paper"
AGREES, DISAGREES, WITHIN_NOISE = "agrees", "disagrees", "within noise"


@dataclass(frozen=True)
class Comparison:
    """A study's reference table and its baseline row (``{"activation": "relu"}``)."""
    table: ReferenceTable
    baseline: Mapping[str, Any] | None = None


def _holds(override: str, record: dict[str, Any]) -> bool:
    """Whether ``group=option`` (a choice) or ``a.b=value`` (a config value) is what the run ran."""
    key, _, value = override.lstrip("+~").partition("=")
    if "." not in key:
        return str(record["choices"].get(key)) == value
    node: Any = record["config"]
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node == yaml.safe_load(value)


def paper_row(runs: Runs, comparison: Comparison) -> ReferenceRow | None:
    """The paper's row these runs reproduce, or None (no row, or two equally specific)."""
    table, baseline = comparison.table, comparison.baseline
    if not runs:
        return None
    named = paper_label(runs)  # made for the paper's row (a rows_from study)
    if named is not None and named in {row.label for row in table.rows}:
        return table.row(named)
    if table.baseline and baseline and all(_holds(f"{g}={o}", r)
                                           for r in runs for g, o in baseline.items()):
        return table.row(table.baseline)
    fits = [row for row in table.keyed() if row.label != table.baseline
            and all(_holds(o, r) for r in runs for o in row.overrides)]
    most = max((len(row.overrides) for row in fits), default=0)
    best = [row for row in fits if len(row.overrides) == most]
    return best[0] if len(best) == 1 else None


def _paper_value(row: ReferenceRow | None, column: str, table: ReferenceTable) -> Cell:
    value = row.value(column) if row else None
    if value is None:
        return Cell()
    if column in table.ratio_to_baseline:
        base = table.row(table.baseline).value(column) if table.baseline else None
        return Cell(mean=value / base, n=1) if base else Cell()
    std = row.value(table.stds[column]) if column in table.stds else None
    return Cell(mean=value, std=std, n=1)


def _description(measured: Column, column: str, table: ReferenceTable) -> str:
    ratio = (f", as a ratio to its {table.baseline} row" if column in table.ratio_to_baseline
             else "")
    unit = table.units.get(column)
    return (f"Paper beside {measured.title}: {table.short}'s {column}"
            + (f" ({unit})" if unit else "") + ratio + ".")


def beside(declared: Sequence[ColumnSpec], measures: Mapping[str, str],
           comparison: Comparison) -> list[ColumnSpec]:
    """``declared`` with a Paper column after each one the reference maps; ``measures``: a
    metric column's key -> its metric's name (how the reference names it)."""
    table = comparison.table
    specs: list[ColumnSpec] = []
    for spec in declared:
        specs.append(spec)
        key = spec.column.key  # a study over several datasets: "<data>_<metric>" first
        column = table.measures.get(key) or table.measures.get(measures.get(key, key))
        if column is None:
            continue
        ratio = column in table.ratio_to_baseline
        specs.append(ColumnSpec(
            Column(spec.column.key + SUFFIX, "Paper", kind="paper",
                   digits=2 if ratio else spec.column.digits),
            lambda runs, c=column: _paper_value(paper_row(runs, comparison), c, table),
            spec.shown,
            lambda records, cells, m=spec.column, c=column: _description(m, c, table)))
    return specs


def _sign(change: float, noise: float) -> int:
    return 0 if abs(change) < noise or change == 0 else (1 if change > 0 else -1)


def agreement(measured: Cell, paper_cell: Cell, measured_base: Cell, paper_base: Cell) -> str:
    """The sign of the row's change against the baseline row, measured against published:
    within the measured baseline's seed std (the table's noise floor) is "within noise"; the
    paper's change is flat within its printed std, where it prints one."""
    if None in (measured.mean, paper_cell.mean, measured_base.mean, paper_base.mean):
        return ""
    ours = _sign(measured.mean - measured_base.mean, measured_base.std or 0.0)
    if ours == 0:
        return WITHIN_NOISE
    theirs = _sign(paper_cell.mean - paper_base.mean, paper_base.std or 0.0)
    return AGREES if ours == theirs else DISAGREES


def pairs(columns: Sequence[Column]) -> list[tuple[int, int]]:
    """(measured column index, its Paper column index) of every Paper column shown."""
    keys = [c.key for c in columns]
    return [(keys.index(c.key[:-len(SUFFIX)]), j) for j, c in enumerate(columns)
            if c.kind == "paper" and c.key[:-len(SUFFIX)] in keys]


def with_agreement(columns: Sequence[Column], rows: list[Row], baseline: int) -> list[Row]:
    """Each Paper cell of a row other than the baseline carries its :func:`agreement`."""
    out = [list(row.cells) for row in rows]
    for i, j in pairs(columns):
        base = rows[baseline].cells
        for r, row in enumerate(rows):
            if r != baseline:
                word = agreement(row.cells[i], row.cells[j], base[i], base[j])
                out[r][j] = replace(row.cells[j], agreement=word)
    return [replace(row, cells=tuple(c)) for row, c in zip(rows, out)]


def summary(columns: Sequence[Column], rows: Sequence[Row],
            per_seed: Sequence[Sequence[Row]], table: ReferenceTable) -> tuple[str, ...]:
    """One line per Paper column: the agreement counts, and Spearman's rho and Kendall's tau-b
    between the rows' measured means and the paper's values, over the rows with both, with
    the bootstrap interval over each row's seeds (``per_seed[r]``: row r's cells, one seed
    each)."""
    lines = [f"Paper: {table.citation}"]
    for i, j in pairs(columns):
        both = [r for r, row in enumerate(rows)
                if row.cells[i].mean is not None and row.cells[j].mean is not None]
        words = [rows[r].cells[j].agreement for r in both if rows[r].cells[j].agreement]
        counts = ", ".join(f"{words.count(w)} {w}" for w in (AGREES, DISAGREES, WITHIN_NOISE))
        seeds = [[v for v in (s.cells[i].mean for s in per_seed[r]) if v is not None]
                 or [rows[r].cells[i].mean] for r in both]
        published = [rows[r].cells[j].mean for r in both]
        if len(both) < 3:
            lines.append(f"{columns[i].title} against the paper: {counts}; ordering: fewer "
                         "than 3 rows with both.")
            continue
        rho = paper.bootstrap(paper.spearman_rho, seeds, published)
        tau = paper.bootstrap(paper.kendall_tau_b, seeds, published)
        lines.append(f"{columns[i].title} against the paper ({len(both)} rows; {counts}): "
                     f"Spearman's rho {rho.text()}, Kendall's tau-b {tau.text()} "
                     f"({paper.INTERVAL[0]:g}-{paper.INTERVAL[1]:g} % bootstrap interval over "
                     f"seeds, {paper.DRAWS} draws).")
    return tuple(lines)
