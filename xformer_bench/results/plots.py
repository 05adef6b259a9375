"""Figures next to the tables: validation curves per variant and the loss/speed trade-off.

matplotlib is imported here only, when plots are asked for, and draws on the Agg canvas (no
display, no pyplot state).  Only finished runs are drawn, as in the tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from xformer_bench.results.aggregate import LOSS_KEY, datasets_of
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


def curve_key(runs: list[dict[str, Any]]) -> str | None:
    """The validation loss, else the first run's primary metric, if the histories carry it."""
    keys = {k for r in runs for p in (r.get("history") or []) for k in p}
    primary = [spec.key("val") for spec in map(primary_metric, runs) if spec is not None]
    return next((k for k in (LOSS_KEY, *primary) if k in keys), None)


def plot_curves(experiment: str, variants: list[Variant], base: Path) -> list[Path]:
    """One panel per dataset: mean curve per variant with a min-max band over seeds."""
    datasets = datasets_of(variants)
    figure = _figure(width=5.0 * max(1, len(datasets)))
    for i, data in enumerate(datasets):
        axes = figure.add_subplot(1, max(1, len(datasets)), i + 1)
        runs = [r for v in variants for r in v.finished_on(data)]
        key = curve_key(runs)
        for j, variant in enumerate(variants):
            steps, mean, low, high = seed_band(variant.finished_on(data), key or "")
            if steps.size:
                axes.plot(steps, mean, color=f"C{j % 10}", label=variant.label)
                axes.fill_between(steps, low, high, color=f"C{j % 10}", alpha=0.2, linewidth=0)
        axes.set(title=f"{experiment} - {data}", xlabel="step", ylabel=key or "validation")
        if axes.lines:
            axes.legend(fontsize="small")
    return _save(figure, base.with_name(base.name + "_curves"))


def plot_tradeoff(table: Table, base: Path) -> list[Path]:
    """Final validation loss against training speed, one point (± std) per variant."""
    columns = [c.key for c in table.columns]
    speed, loss = columns.index("steps_per_sec"), columns.index("final_loss")
    figure = _figure(width=5.5)
    axes = figure.add_subplot(1, 1, 1)
    for j, row in enumerate(table.rows):
        x, y = row.cells[speed], row.cells[loss]
        if x.mean is None or y.mean is None:
            continue
        axes.errorbar(x.mean, y.mean, xerr=x.std or 0.0, yerr=y.std or 0.0, fmt="o",
                      color=f"C{j % 10}", capsize=3)
        axes.annotate(row.label, (x.mean, y.mean), textcoords="offset points", xytext=(5, 5),
                      fontsize="small")
    axes.set(title=f"{table.experiment}: quality vs speed", xlabel="steps / s",
             ylabel=f"final validation loss ({table.loss_data})")
    return _save(figure, base.with_name(base.name + "_tradeoff"))


def write_plots(table: Table, variants: list[Variant], base: Path) -> list[Path]:
    return plot_curves(table.experiment, variants, base) + plot_tradeoff(table, base)


def _figure(width: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, 4.0), layout="constrained")
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
