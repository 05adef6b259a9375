"""Recall against state size, as Zoology's Figure 2 (Arora et al. 2023, "Zoology: Measuring and
Improving Recall in Efficient Language Models"): MQAR accuracy (y) against the bytes of state
each layer keeps to continue a sequence (x, log scale; the record's ``state_bytes.per_layer``,
:mod:`xformer_bench.models.state_size`), one panel per task setting (sequence length, pairs),
one line per token mixer (a hybrid named by its layout), its points the model sizes run,
each the mean over seeds of the test accuracy with a min-max bar (named in the legend).

Only finished runs whose task reports accuracy (``data=mqar``) and whose record carries the
state size are drawn; an experiment without them gets no figure.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from xformer_bench.hybrid_layout import hybrid_label
from xformer_bench.metric_spec import ACCURACY

Point = tuple[float, float, float, float]  # state bytes, mean, min, max accuracy


def _accuracy(record: dict[str, Any]) -> float | None:
    value = (record.get("test") or {}).get(ACCURACY.key("test"))
    return float(value) if isinstance(value, (int, float)) and np.isfinite(value) else None


def _state_bytes(record: dict[str, Any]) -> float | None:
    value = (record.get("state_bytes") or {}).get("per_layer")
    return float(value) if isinstance(value, (int, float)) and value > 0 else None


def panel_of(record: dict[str, Any]) -> str:
    """The task setting a record ran: "MQAR T=256, 16 pairs"."""
    data = record["config"].get("data") or {}
    pairs = f", {data['n_pairs']} pairs" if "n_pairs" in data else ""
    return f"{data.get('label') or data.get('name')} T={data.get('seq_len')}{pairs}"


def mixer_of(record: dict[str, Any]) -> str:
    """The token mixers in words: the attention option's label, or the hybrid's layout."""
    config = record["config"]
    attention = config.get("attention") or {}
    return hybrid_label(config) or str(attention.get("label") or attention.get("name"))


def recall_points(records: Iterable[dict[str, Any]]) -> dict[str, dict[str, list[Point]]]:
    """``{panel: {mixer: [(state bytes, mean, min, max accuracy), ...]}}``, points by state
    size, over the finished records with an accuracy and a state size."""
    grouped: dict[str, dict[str, dict[float, list[float]]]] = {}
    for record in records:
        accuracy, state = _accuracy(record), _state_bytes(record)
        if record.get("status") != "finished" or accuracy is None or state is None:
            continue
        series = grouped.setdefault(panel_of(record), {}).setdefault(mixer_of(record), {})
        series.setdefault(state, []).append(accuracy)
    return {panel: {mixer: [(x, float(np.mean(ys)), min(ys), max(ys))
                            for x, ys in sorted(points.items())]
                    for mixer, points in sorted(series.items())}
            for panel, series in sorted(grouped.items())}


def plot_recall_vs_state(experiment: str, records: Iterable[dict[str, Any]],
                         base: Path) -> list[Path]:
    """``<base>_recall_state.{png,pdf}``; nothing when no record has both measures."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    from xformer_bench.results.plots import _figure, _legend, _save, style

    panels = recall_points(records)
    if not panels:
        return []
    mixers = sorted({m for series in panels.values() for m in series})
    figure = _figure(width=4.5 * len(panels), rows=len(mixers))
    for i, (panel, series) in enumerate(panels.items()):
        axes = figure.add_subplot(1, len(panels), i + 1)
        for mixer, points in series.items():
            x, mean, low, high = (np.asarray(v) for v in zip(*points))
            look = style(mixers.index(mixer))
            axes.errorbar(x, 100 * mean, yerr=100 * np.stack([mean - low, high - mean]),
                          label=mixer, capsize=3, markersize=4, **look)
        axes.set_xscale("log")
        axes.xaxis.set_minor_formatter(NullFormatter())  # decade labels only: no overlap
        axes.set(title=f"{experiment} - {panel}", xlabel="state per layer (bytes, fp32)",
                 ylabel=f"test {ACCURACY.title.replace(' %', ' (%)')}", ylim=(-2, 102))
        axes.grid(True, which="both", alpha=0.3)
    bar = Line2D([], [], color="0.3", marker="|", markersize=10, linestyle="none",
                 label="bar: min-max over seeds; point: mean")
    _legend(figure, len(mixers) + 1, extra=[bar])
    return _save(figure, base.with_name(base.name + "_recall_state"))
