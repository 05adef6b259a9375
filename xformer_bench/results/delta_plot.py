"""Each row against the baseline row: a dot plot of the difference in the table's first metric
(``<experiment>_delta.{png,pdf}``), which reads where 40 overlapping curves do not.

A row's point is its mean over seeds less the baseline row's (the table's two cells), its bar
the 95 % Welch interval of that difference, ``d ± t(0.975, df) sqrt(s1²/n1 + s2²/n2)`` with the
Welch-Satterthwaite df (as the table's test, :mod:`~xformer_bench.results.significance`, but per
row, uncorrected); a row or baseline with fewer than two seeds, or no variance, gets the point
alone.  A filled point is one the table marks † (Holm-corrected over its rows, above the noise
floor).  Rows are sorted best first, a vertical line at 0 is the baseline.  A table without a
baseline row gets no figure.
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from pathlib import Path

from xformer_bench.results.plots import _figure, _save, column_words, metric_column
from xformer_bench.results.significance import regularized_incomplete_beta
from xformer_bench.results.table import Cell, Table
from xformer_bench.results.variants import Variant

LEVEL = 0.95


@dataclass(frozen=True)
class Delta:
    label: str
    difference: float                     # row mean - baseline mean
    low: float | None                     # the interval's ends; None: not computable
    high: float | None
    marked: bool                          # † in the table


def t_quantile(df: float, level: float = LEVEL) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom: the t
    whose two-sided p-value, ``I_{df/(df+t²)}(df/2, 1/2)``, is ``1 - level`` (bisection)."""
    low, high = 0.0, 1e3
    for _ in range(200):
        t = (low + high) / 2
        if regularized_incomplete_beta(df / (df + t * t), df / 2, 0.5) > 1 - level:
            low = t
        else:
            high = t
    return (low + high) / 2


def interval(row: Cell, baseline: Cell, level: float = LEVEL) -> tuple[float, float] | None:
    """The Welch interval of ``row.mean - baseline.mean``; None with fewer than two seeds on a
    side or no variance on either."""
    if row.n < 2 or baseline.n < 2 or row.std is None or baseline.std is None:
        return None
    v1, v2 = row.std ** 2 / row.n, baseline.std ** 2 / baseline.n
    if v1 + v2 == 0.0:
        return None
    df = (v1 + v2) ** 2 / (v1 ** 2 / (row.n - 1) + v2 ** 2 / (baseline.n - 1))
    half = t_quantile(df, level) * math.sqrt(v1 + v2)
    difference = row.mean - baseline.mean
    return difference - half, difference + half


def deltas(table: Table, column: int | None = None) -> list[Delta]:
    """Each row but the baseline with a value in ``column`` (default: the table's first
    metric), against the baseline row, best first."""
    j = metric_column(table) if column is None else column
    base = next((row for row in table.rows if row.label == table.baseline), None)
    if base is None or base.cells[j].mean is None:
        return []
    reference = base.cells[j]
    found = []
    for row in table.rows:
        cell = row.cells[j]
        if row is base or cell.mean is None:
            continue
        ends = interval(cell, reference)
        found.append(Delta(row.label, cell.mean - reference.mean, *(ends or (None, None)),
                           marked=cell.marked))
    sign = -1 if table.columns[j].higher_is_better else 1
    return sorted(found, key=lambda d: sign * d.difference)


def plot_delta(table: Table, variants: list[Variant], base: Path) -> list[Path]:
    """``<base>_delta.{png,pdf}`` (:func:`draw_delta`); nothing (no stale one) without a
    baseline row."""
    return _save(draw_delta(table, variants), base.with_name(base.name + "_delta"))


def draw_delta(table: Table, variants: list[Variant]):
    """:func:`deltas` as dots with their intervals, best on top; None without a baseline."""
    from matplotlib.lines import Line2D

    j = metric_column(table)
    found = deltas(table, j)
    if not found:
        return None
    figure = _figure(width=6.0)
    figure.set_size_inches(8.0, 2.2 + 0.26 * len(found))  # a line per row, 40 rows too
    axes = figure.add_subplot(1, 1, 1)
    top = len(found) - 1
    for k, delta in enumerate(found):
        y = top - k  # the best row on top
        if delta.low is not None:
            axes.plot([delta.low, delta.high], [y, y], color="0.25", linewidth=1.2,
                      solid_capstyle="butt")
        axes.plot([delta.difference], [y], marker="o", linestyle="none", color="0.1",
                  markerfacecolor="0.1" if delta.marked else "white", markersize=6)
    axes.axvline(0.0, color="#d62728", linewidth=1.0)
    axes.set_yticks(range(len(found)), [d.label for d in reversed(found)])
    axes.set_ylim(-0.7, top + 0.7)
    axes.grid(True, axis="x", alpha=0.3)
    better = "higher" if table.columns[j].higher_is_better else "lower"
    axes.set_xlabel(textwrap.fill(f"mean over seeds less {table.baseline}'s, "
                                  f"{column_words(table, variants, j)} ({better} is better)", 50))
    figure.suptitle(f"{table.experiment}: each row against the baseline, {table.baseline}")
    key = [Line2D([], [], color="#d62728", label=f"0: the baseline, {table.baseline}"),
           Line2D([], [], color="0.25", label=f"{LEVEL:.0%} Welch interval over seeds (per row)"),
           Line2D([], [], marker="o", color="0.1", linestyle="none",
                  label="filled: † in the table (Holm-corrected)"),
           Line2D([], [], marker="o", color="0.1", markerfacecolor="white", linestyle="none",
                  label="open: not †")]
    if any(d.low is None for d in found):
        key.append(Line2D([], [], linestyle="none", label="no bar: < 2 seeds or no variance"))
    figure.legend(handles=key, loc="outside lower center", ncols=2, fontsize="small")
    return figure
