"""Figures next to the tables: validation curves per variant, the quality/cost trade-off, each
row's difference from the baseline row (:mod:`xformer_bench.results.delta_plot`) and recall
against state size (:mod:`xformer_bench.results.recall_plot`).

Axes are named in words from the metric the records declare (``val/bpb`` of byte-level data:
"validation bits per byte"), every band and bar says what it spans, and no two rows share a
colour and line style (:func:`style`).  The trade-off plot takes its speeds from a calibrated
timing pass only (:mod:`~xformer_bench.results.speed`): without one it plots against the
parameters (or operations per step), never against the runs' own, perturbed, steps/s.

matplotlib is imported only when plots are asked for, and draws on the Agg canvas (no
display, no pyplot state).  Only finished runs are drawn, as in the tables.
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import numpy as np

from xformer_bench.metric_spec import BITS_PER, MetricSpec
from xformer_bench.results.aggregate import datasets_of
from xformer_bench.results.columns import LOSS_KEY
from xformer_bench.results.metrics import table_metrics
from xformer_bench.results.ngram_floors import FLOOR_ORDERS_SHOWN
from xformer_bench.results.record import primary_metric
from xformer_bench.results.speed import CALIBRATED
from xformer_bench.results.table import Cell, Table, si
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


PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",   # matplotlib's tab10
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
           "#000000", "#000075", "#800000", "#469990", "#808000",   # ten more, apart from those
           "#f032e6", "#4363d8", "#9a6324", "#e6ab02", "#3cb44b")
LINE_STYLES = ("-", "--", ":", "-.", (0, (6, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 3)),
               (0, (8, 2, 2, 2)))
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def style(index: int) -> dict[str, Any]:
    """Row ``index``'s colour, line style and marker: the first ten rows matplotlib's ten
    colours, solid; each next ten another line style, and rows 10-19 ten other colours (ReLU
    and Sigmoid, rows 0 and 10 of the activation study: blue solid, black dashed).  No two of
    the first 80 rows share a (colour, line style) pair."""
    return {"color": PALETTE[index % len(PALETTE)],
            "linestyle": LINE_STYLES[(index // 10) % len(LINE_STYLES)],
            "marker": MARKERS[index % len(MARKERS)]}


SPLITS = {"val": "validation", "test": "test"}
UNITS = {"bytes": "byte", "dims": "dimension", "tokens": "token", "examples": "example"}


def metric_words(name: str, unit: str | None, spec: MetricSpec | None = None) -> str:
    """A metric in words: "bits per byte", "accuracy (%)", "loss (nats per byte)"; ``name`` as
    logged (``bpb``, ``loss``), ``unit`` the records' ``eval_unit``."""
    bits = next((u for u, s in BITS_PER.items() if s.name == name), None)
    if bits is not None:
        return f"bits per {UNITS.get(bits, bits)}"
    if name == "loss":
        return f"loss (nats per {UNITS.get(unit or '', 'token')})"
    return (spec.title if spec is not None else name).replace(" %", " (%)")


def key_words(key: str, runs: list[dict[str, Any]]) -> str:
    """A logged key in words: ``val/bpb`` -> "validation bits per byte"."""
    split, _, name = key.partition("/")
    unit = next((r.get("eval_unit") for r in runs if r.get("eval_unit")), None)
    return f"{SPLITS.get(split, split)} {metric_words(name, unit, _spec(name, runs))}"


def _spec(name: str, runs: list[dict[str, Any]]) -> MetricSpec | None:
    return next((s for r in runs for s in map(MetricSpec.from_record, r.get("metrics") or [])
                 if s.name == name), None)


def metric_column(table: Table) -> int:
    """The table's first metric: the primary metric of its main dataset (e.g. test bpb), the
    final validation loss when there is none."""
    keys = [c.key for c in table.columns]
    found = [i for i, c in enumerate(table.columns)
             if c.higher_is_better is not None and c.key not in ("early_loss", "final_loss")]
    return found[0] if found else keys.index("final_loss")


def column_words(table: Table, variants: list[Variant], j: int) -> str:
    """Metric column ``j`` in words: "test bits per byte on text"."""
    records = [r for v in variants for r in v.records]
    metric = next((m for m in table_metrics(records, datasets_of(variants))
                   if m.column_key == table.columns[j].key), None)
    if metric is None:  # the final validation loss
        return f"{key_words(LOSS_KEY, records)}, final"
    runs = [r for r in records if metric.spec.name in {s.get("name") for s in r["metrics"]}]
    return f"{key_words(metric.test_key, runs)} on {metric.data}"


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
    """One panel per dataset: mean curve per variant with a min-max band over its seeds (named
    in the legend), and the corpus's n-gram floors as dashed lines (:func:`floor_lines`)."""
    from matplotlib.patches import Patch

    datasets = datasets_of(variants)
    figure = _figure(width=5.0 * max(1, len(datasets)), rows=len(variants) + 1)
    seeds = set()
    for i, data in enumerate(datasets):
        axes = figure.add_subplot(1, max(1, len(datasets)), i + 1)
        runs = [r for v in variants for r in v.finished_on(data)]
        key = curve_key(runs)
        spec = _spec(key.partition("/")[2], runs) if key else None
        scale = spec.scale if spec is not None else 1.0
        for j, variant in enumerate(variants):
            steps, mean, low, high = seed_band(variant.finished_on(data), key or "")
            if steps.size:
                look = style(j)
                axes.plot(steps, scale * mean, label=variant.label, markersize=3, **look)
                if len(variant.finished_on(data)) > 1:
                    seeds.add(len(variant.finished_on(data)))
                    axes.fill_between(steps, scale * low, scale * high, color=look["color"],
                                      alpha=0.2, linewidth=0)
        for name, bits in floor_lines(runs, key):
            axes.axhline(bits, color="0.45", linestyle=(0, (4, 3)), linewidth=0.8)
            axes.annotate(f"{name} floor", (1.0, bits), xycoords=("axes fraction", "data"),
                          xytext=(-2, 2), textcoords="offset points", ha="right", fontsize=7,
                          color="0.35")
        axes.set(title=f"{experiment} - {data}", xlabel="optimizer step",
                 ylabel=key_words(key, runs) if key else "validation")
    counts = "-".join(str(n) for n in sorted({min(seeds, default=0), max(seeds, default=0)}))
    band = [Patch(color="0.5", alpha=0.3, linewidth=0,  # what the shaded band spans
                  label=f"shaded: min-max over {counts} seeds")] if seeds else []
    _legend(figure, len(variants) + 1, extra=band)
    return _save(figure, base.with_name(base.name + "_curves"))


def speed_axis(table: Table, variants: list[Variant]) -> tuple[int, list[int], str, str] | None:
    """The trade-off's x: (column, rows drawn, label, note).  Step/s only where a calibrated
    timing pass measured it (the records' :data:`~xformer_bench.results.speed.CALIBRATED`),
    unmarked (neither perturbed nor too spread); with fewer than two such rows, the parameters
    or the operations per step where they vary by 5 % or more; else None: no trade-off."""
    keys = [c.key for c in table.columns]
    y = metric_column(table)
    rows = [i for i, row in enumerate(table.rows) if row.cells[y].mean is not None]
    if "steps_per_sec" in keys and len(variants) == len(table.rows):
        j = keys.index("steps_per_sec")
        timed = [i for i in rows if _calibrated(table.rows[i].cells[j], variants[i])]
        if len(timed) >= 2:
            left = [table.rows[i].label for i in rows if i not in timed]
            return j, timed, "training steps per second (calibrated timing pass)", (
                "x: median ± IQR over the timing pass's repeats; y: mean ± std over seeds"
                + (f"; no calibrated speed, not drawn: {', '.join(left)}" if left else ""))
    for key, label in (("params", "parameters"), ("ops", "operations per training step")):
        values = [table.rows[i].cells[keys.index(key)].mean for i in rows] if key in keys else []
        if values and None not in values and min(values) > 0 and max(values) >= 1.05 * min(values):
            return keys.index(key), rows, label, ("y: mean ± std over seeds; speed not shown: no "
                                                 "calibrated timing pass (make time-rows)")
    return None


def _calibrated(cell: Cell, variant: Variant) -> bool:
    return (cell.mean is not None and not cell.footnote
            and any(r.get(CALIBRATED) for r in variant.records))


def plot_tradeoff(table: Table, variants: list[Variant], base: Path) -> list[Path]:
    """``<base>_tradeoff.{png,pdf}`` (:func:`draw_tradeoff`); nothing, and no stale figure,
    when no axis of cost can be drawn."""
    return _save(draw_tradeoff(table, variants), base.with_name(base.name + "_tradeoff"))


def draw_tradeoff(table: Table, variants: list[Variant]):
    """The table's first metric against calibrated training speed (else the parameters:
    :func:`speed_axis`), one point (± spread) per row; None without an axis of cost."""
    axis = speed_axis(table, variants)
    if axis is None:
        return None
    x, drawn, xlabel, note = axis
    y = metric_column(table)
    figure = _figure(width=5.5, rows=len(drawn))
    axes = figure.add_subplot(1, 1, 1)
    for i in drawn:
        row = table.rows[i]
        look = style(i)
        xc, yc = row.cells[x], row.cells[y]
        axes.errorbar(xc.mean, yc.mean, xerr=xc.std or 0.0, yerr=yc.std or 0.0,
                      fmt=look["marker"], color=look["color"], capsize=3, label=row.label)
        if len(drawn) <= ANNOTATED_ROWS:
            axes.annotate(row.label, (xc.mean, yc.mean), textcoords="offset points",
                          xytext=(5, 5), fontsize="small")
    if table.columns[x].kind == "si":
        from matplotlib.ticker import FuncFormatter

        values = [table.rows[i].cells[x].mean for i in drawn]
        axes.set_xscale("log" if max(values) > 4 * min(values) else "linear")
        axes.xaxis.set_major_formatter(FuncFormatter(lambda value, _: si(value)))
        axes.xaxis.set_minor_formatter(FuncFormatter(lambda value, _: ""))
    axes.set_title(f"{table.experiment}: quality vs {xlabel.split(' (')[0]}\n"
                   + textwrap.fill(note, 55), fontsize="medium")
    axes.set(xlabel=xlabel, ylabel=column_words(table, variants, y))
    if len(drawn) > ANNOTATED_ROWS:
        _legend(figure, len(drawn))
    return figure


def write_plots(table: Table, variants: list[Variant], base: Path) -> list[Path]:
    """The curves, the trade-off, each row against the baseline and, for recall runs,
    accuracy against state size."""
    from xformer_bench.results.delta_plot import plot_delta
    from xformer_bench.results.recall_plot import plot_recall_vs_state

    records = [r for v in variants for r in v.records]
    return (plot_curves(table.experiment, variants, base) + plot_tradeoff(table, variants, base)
            + plot_delta(table, variants, base)
            + plot_recall_vs_state(table.experiment, records, base))


ANNOTATED_ROWS = 8
"""Up to this many rows the trade-off plot writes labels beside the points; beyond, a legend."""
LEGEND_ROWS_PER_COLUMN = 18


def _legend(figure, rows: int, extra=()) -> None:
    """One legend for the figure, outside the axes on the right (never over the curves), in
    as many columns as 30+ rows need; ``extra`` handles last (what a band or bar spans)."""
    handles, labels = [], []
    for axes in figure.axes:
        for handle, label in zip(*axes.get_legend_handles_labels()):
            if label not in labels:
                handles.append(handle)
                labels.append(label)
    handles += list(extra)
    labels += [handle.get_label() for handle in extra]
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
    """``stem.png`` and ``stem.pdf``; with no ``figure``, none (a stale one is removed)."""
    paths = []
    for fmt in FORMATS:
        path = stem.with_suffix(f".{fmt}")
        if figure is None:
            path.unlink(missing_ok=True)
            continue
        metadata = {"CreationDate": None} if fmt == "pdf" else {"Software": None}
        figure.savefig(path, format=fmt, metadata=metadata, dpi=150)
        paths.append(path)
    return paths
