"""Figures next to the tables: validation curves per variant and the loss/speed trade-off
(and recall against state size: :mod:`xformer_bench.results.recall_plot`).

matplotlib is imported here only, when plots are asked for, and draws on the Agg canvas (no
display, no pyplot state).  Only finished runs are drawn, as in the tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from xformer_bench.results.aggregate import datasets_of
from xformer_bench.results.columns import LOSS_KEY
from xformer_bench.results.ngram_floors import FLOOR_ORDERS_SHOWN
from xformer_bench.results.record import primary_metric
from xformer_bench.results.table import Table
from xformer_bench.results.variants import Variant

FORMATS = ("png", "pdf")


def seed_band(runs: list[dict[str, Any]], key: str) -> tuple[np.ndarray, ...]:
    """Steps, mean, min and max of ``key`` over the runs' validation histories."""
    by_step: dict[int, list[float]] = {}
    for run in runs:
        for point in run.get("history") or []:
            value = point.get(key)
            if isinstance(value, (int, float)) and np.isfinite(value):
                by_step.setdefault(int(point["step"]), []).append(float(value))
    steps = sorted(by_step)
    values = [np.asarray(by_step[s]) for s in steps]
    return (np.asarray(steps), np.asarray([v.mean() for v in values]),
            np.asarray([v.min() for v in values]), np.asarray([v.max() for v in values]))


LINE_STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def style(index: int) -> dict[str, str]:
    """A colour and line style no other of the first 40 rows shares: 10 colours, then the
    next line style (ReLU and Sigmoid, rows 0 and 10 of the activation study, differ)."""
    return {"color": f"C{index % 10}", "linestyle": LINE_STYLES[(index // 10) % len(LINE_STYLES)],
            "marker": MARKERS[index % len(MARKERS)]}


def curve_key(runs: list[dict[str, Any]]) -> str | None:
    """The runs' primary metric on validation (bpb: the table's metric), else the validation
    loss, if the histories carry it."""
    keys = {k for r in runs for p in (r.get("history") or []) for k in p}
    primary = [spec.key("val") for spec in map(primary_metric, runs) if spec is not None]
    return next((k for k in (*primary, LOSS_KEY) if k in keys), None)


def floor_lines(runs: list[dict[str, Any]], key: str | None) -> list[tuple[str, float]]:
    """``[("2-gram", bits), ...]``: the n-gram floors the runs' records keep, drawn where the
    curve is in bits per byte."""
    if key != "val/bpb":
        return []
    kept = next((r["ngram_floors"] for r in runs if isinstance(r.get("ngram_floors"), dict)), {})
    bits = kept.get("bits_per_byte") or {}
    return [(f"{order}-gram", float(bits[str(order)])) for order in FLOOR_ORDERS_SHOWN
            if isinstance(bits.get(str(order)), (int, float))]


def plot_curves(experiment: str, variants: list[Variant], base: Path) -> list[Path]:
    """One panel per dataset: mean curve per variant with a min-max band over seeds, and the
    corpus's n-gram floors as dashed lines (:func:`floor_lines`)."""
    datasets = datasets_of(variants)
    figure = _figure(width=5.0 * max(1, len(datasets)), rows=len(variants))
    for i, data in enumerate(datasets):
        axes = figure.add_subplot(1, max(1, len(datasets)), i + 1)
        runs = [r for v in variants for r in v.finished_on(data)]
        key = curve_key(runs)
        for j, variant in enumerate(variants):
            steps, mean, low, high = seed_band(variant.finished_on(data), key or "")
            if steps.size:
                look = style(j)
                axes.plot(steps, mean, label=variant.label, markersize=3, **look)
                axes.fill_between(steps, low, high, color=look["color"], alpha=0.2, linewidth=0)
        for name, bits in floor_lines(runs, key):
            axes.axhline(bits, color="0.45", linestyle=(0, (4, 3)), linewidth=0.8)
            axes.annotate(f"{name} floor", (1.0, bits), xycoords=("axes fraction", "data"),
                          xytext=(-2, 2), textcoords="offset points", ha="right", fontsize=7,
                          color="0.35")
        axes.set(title=f"{experiment} - {data}", xlabel="step", ylabel=key or "validation")
    _legend(figure, len(variants))
    return _save(figure, base.with_name(base.name + "_curves"))


def plot_tradeoff(table: Table, base: Path) -> list[Path]:
    """The table's first metric (the primary metric of its main dataset, e.g. test bpb; the
    final validation loss when there is none) against training speed, one point (± std) per
    variant."""
    columns = [c.key for c in table.columns]
    speed = columns.index("steps_per_sec")
    metric_columns = [i for i, c in enumerate(table.columns)
                      if c.higher_is_better is not None and c.key not in ("early_loss", "final_loss")]
    loss = metric_columns[0] if metric_columns else columns.index("final_loss")
    figure = _figure(width=5.5, rows=len(table.rows))
    axes = figure.add_subplot(1, 1, 1)
    for j, row in enumerate(table.rows):
        x, y = row.cells[speed], row.cells[loss]
        if x.mean is None or y.mean is None:
            continue
        look = style(j)
        axes.errorbar(x.mean, y.mean, xerr=x.std or 0.0, yerr=y.std or 0.0, fmt=look["marker"],
                      color=look["color"], capsize=3, label=row.label)
        if len(table.rows) <= ANNOTATED_ROWS:
            axes.annotate(row.label, (x.mean, y.mean), textcoords="offset points",
                          xytext=(5, 5), fontsize="small")
    axes.set(title=f"{table.experiment}: quality vs speed", xlabel="steps / s",
             ylabel=table.columns[loss].title)
    if len(table.rows) > ANNOTATED_ROWS:
        _legend(figure, len(table.rows))
    return _save(figure, base.with_name(base.name + "_tradeoff"))


def write_plots(table: Table, variants: list[Variant], base: Path) -> list[Path]:
    """The curves, the trade-off and, for recall runs, accuracy against state size."""
    from xformer_bench.results.recall_plot import plot_recall_vs_state

    records = [r for v in variants for r in v.records]
    return plot_curves(table.experiment, variants, base) + plot_tradeoff(table, base) + \
        plot_recall_vs_state(table.experiment, records, base)


ANNOTATED_ROWS = 8
"""Up to this many rows the trade-off plot writes labels beside the points; beyond, a legend."""
LEGEND_ROWS_PER_COLUMN = 18


def _legend(figure, rows: int) -> None:
    """One legend for the figure, outside the axes on the right (never over the curves), in
    as many columns as 30+ rows need."""
    handles, labels = [], []
    for axes in figure.axes:
        for handle, label in zip(*axes.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    if handles:
        figure.legend(handles, labels, loc="outside right upper", fontsize="small",
                      ncols=1 + (rows - 1) // LEGEND_ROWS_PER_COLUMN)


def _figure(width: float, rows: int = 1):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    columns = 1 + (max(rows, 1) - 1) // LEGEND_ROWS_PER_COLUMN
    height = max(4.0, 0.24 * min(rows, LEGEND_ROWS_PER_COLUMN) + 0.8)
    figure = Figure(figsize=(width + 3.2 * columns, height), layout="constrained")
    FigureCanvasAgg(figure)  # attaches itself: savefig draws with Agg
    return figure


def _save(figure, stem: Path) -> list[Path]:
    paths = []
    for fmt in FORMATS:
        path = stem.with_suffix(f".{fmt}")
        metadata = {"CreationDate": None} if fmt == "pdf" else {"Software": None}
        figure.savefig(path, format=fmt, metadata=metadata, dpi=150)
        paths.append(path)
    return paths
