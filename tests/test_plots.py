"""Plots stay readable at 30 rows, say what they show in words, and plot no speed that is
not a result."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from xformer_bench.results.plots import curve_key, style


def test_every_row_of_thirty_has_its_own_colour_and_line_style():
    looks = [(style(i)["color"], style(i)["linestyle"]) for i in range(30)]
    assert len(set(looks)) == 30
    assert looks[0] != looks[10]  # ReLU and Sigmoid of the activation study


def test_curves_show_the_primary_metric_not_nats():
    run = {"history": [{"step": 1, "val/loss": 2.0, "val/bpb": 2.9}],
           "metrics": [{"name": "bpb", "title": "bpb"}], "primary_metric": "bpb"}
    assert curve_key([run]) == "val/bpb"
    assert curve_key([{**run, "metrics": [], "primary_metric": None}]) == "val/loss"


def test_thirty_rows_get_a_legend_beside_the_axes_not_over_the_curves(tmp_path):
    """The zoo has 27+ rows: the legend goes outside the axes, in columns."""
    from xformer_bench.results.plots import _figure, _legend

    figure = _figure(width=5.0, rows=30)
    axes = figure.add_subplot(1, 1, 1)
    for j in range(30):
        axes.plot([0, 1], [j, j + 1], label=f"variant {j}", **style(j))
    _legend(figure, 30)
    figure.savefig(tmp_path / "curves.png")
    renderer = figure.canvas.get_renderer()
    legend = figure.legends[0].get_window_extent(renderer)
    panel = axes.get_window_extent(renderer)
    assert legend.x0 >= panel.x1  # entirely right of the curves
    assert figure.legends[0]._ncols == 2 and len(figure.legends[0].get_texts()) == 30


def test_the_curves_draw_the_corpus_floors_only_where_they_are_in_bits_per_byte():
    from xformer_bench.results.plots import floor_lines

    kept = {"ngram_floors": {"bits_per_byte": {"1": 4.85, "2": 3.61, "3": 3.04, "4": 2.6,
                                               "5": 2.38}}}
    assert floor_lines([{}, kept], "val/bpb") == [("2-gram", 3.61), ("3-gram", 3.04),
                                                  ("4-gram", 2.6), ("5-gram", 2.38)]
    assert floor_lines([kept], "val/loss") == []  # nats per token: another unit
    assert floor_lines([{"ngram_floors": None}], "val/bpb") == []  # records from before floors


# --- plots that read: words on the axes, distinct looks, the band named, the delta plot, and a
# trade-off that never plots a perturbed speed ----------------------------------------------

SHIPPED = (Path(__file__).resolve().parents[1] / "results" / "reference"
           / "narang_activations_300_steps_tinyshakespeare" / "records" / "narang_activations")


def _curve_variant(j: int, seeds: int = 2):
    from xformer_bench.results.variants import Variant

    runs = tuple({"run_id": f"r{j}_s{s}", "seed": s, "status": "finished", "eval_unit": "bytes",
                  "metrics": [{"name": "bpb", "title": "bpb"}], "primary_metric": "bpb",
                  "choices": {"data": "text"}, "config": {"data": {"name": "text"}},
                  "history": [{"step": k, "val/bpb": 4.0 - 0.1 * k - 0.01 * j + 0.005 * s,
                               "val/loss": 2.0} for k in (1, 2, 3)]}
                 for s in range(seeds))
    return Variant(key=(("activation", f"a{j}"),), label=f"row {j}", records=runs)


def test_curves_say_what_they_plot_in_words_and_name_the_band(tmp_path, monkeypatch):
    from xformer_bench.results import plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda figure, stem: drawn.append(figure) or [])
    plots.plot_curves("x", [_curve_variant(j) for j in range(3)], tmp_path / "x")
    axes = drawn[0].axes[0]
    assert axes.get_ylabel() == "validation bits per byte"
    assert axes.get_xlabel() == "optimizer step"
    legend = [t.get_text() for t in drawn[0].legends[0].get_texts()]
    assert legend[-1] == "shaded: min-max over 2 seeds"  # what the band spans


def test_metric_words_come_from_the_metric_and_the_records_unit():
    from xformer_bench.results.plots import key_words

    def runs(unit, name, title, scale=1.0):
        return [{"eval_unit": unit, "metrics": [{"name": name, "title": title, "scale": scale}]}]

    assert key_words("val/bpb", runs("bytes", "bpb", "bpb")) == "validation bits per byte"
    assert key_words("test/bits_per_dim", runs("dims", "bits_per_dim", "bits/dim")) == \
        "test bits per dimension"
    assert key_words("val/accuracy", runs("tokens", "accuracy", "accuracy %", 100.0)) == \
        "validation accuracy (%)"
    assert key_words("val/loss", runs("bytes", "bpb", "bpb")) == \
        "validation loss (nats per byte)"


def test_twelve_curves_never_share_a_colour_and_line_style(tmp_path, monkeypatch):
    from matplotlib.colors import to_hex

    from xformer_bench.results import plots

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda figure, stem: drawn.append(figure) or [])
    plots.plot_curves("x", [_curve_variant(j) for j in range(12)], tmp_path / "x")
    lines = [line for line in drawn[0].axes[0].get_lines()
             if not line.get_label().startswith("_")]
    assert len(lines) == 12
    looks = {(to_hex(line.get_color()), str(line.get_linestyle())) for line in lines}
    assert len(looks) == 12
    colours = {to_hex(line.get_color()) for line in lines}
    assert len(colours) == 12  # up to 20 rows not even the colour repeats
    assert len({(plots.style(i)["color"], str(plots.style(i)["linestyle"]))
                for i in range(80)}) == 80


def _study(values: dict[str, list[float]], params: dict[str, int] | None = None,
           perturbed: bool = False) -> list[dict]:
    """Records of the shipped activation study, their test bpb (and params) set to ``values``."""
    records = []
    for activation, bpbs in values.items():
        paths = sorted(SHIPPED.glob(f"vanilla-full-layernorm-{activation}-sinusoidal_s*.json"))
        for path, bpb in zip(paths, bpbs):
            record = json.loads(path.read_text())
            record["test"]["test/bpb"] = bpb
            record["timing_conditions"] = {**record["timing_conditions"], "alone": not perturbed}
            if params:
                record["params"] = params[activation]
            records.append(record)
    return records


def _table(records, timing=None):
    from xformer_bench.results.aggregate import build_table
    from xformer_bench.results.speed import with_calibration
    from xformer_bench.results.variants import group_variants

    variants = group_variants(with_calibration(records, timing or {}))
    return build_table("narang_activations", variants, {"activation": "relu"}), variants


KNOWN = {"relu": [3.0, 3.1, 3.2], "gelu": [2.9, 3.0, 3.1], "swish": [3.3, 3.5, 3.4]}


def test_the_delta_plot_shows_the_tables_differences_with_welch_intervals():
    from xformer_bench.results.delta_plot import deltas, draw_delta, t_quantile
    from xformer_bench.results.plots import metric_column

    table, variants = _table(_study(KNOWN))
    j = metric_column(table)
    cells = {row.label: row.cells[j] for row in table.rows}
    assert [d.label for d in deltas(table)] == ["GeLU", "Swish"]  # best first, no baseline
    gelu, swish = deltas(table)
    assert gelu.difference == pytest.approx(cells["GeLU"].mean - cells["ReLU"].mean)
    assert (gelu.difference, swish.difference) == (pytest.approx(-0.1), pytest.approx(0.3))
    half = t_quantile(4) * math.sqrt(0.1 ** 2 / 3 + 0.1 ** 2 / 3)  # equal stds: df = 4
    assert t_quantile(4) == pytest.approx(2.776445, abs=1e-5)
    assert (gelu.low, gelu.high) == (pytest.approx(-0.1 - half), pytest.approx(-0.1 + half))

    figure = draw_delta(table, variants)
    axes = figure.axes[0]
    points = [line for line in axes.get_lines() if line.get_marker() == "o"]
    by_y = {round(line.get_ydata()[0]): line.get_xdata()[0] for line in points}
    assert by_y == {1: pytest.approx(-0.1), 0: pytest.approx(0.3)}  # GeLU on top
    ticks = [t.get_text() for t in axes.get_yticklabels()]
    assert ticks == ["Swish", "GeLU"]
    assert any(list(line.get_xdata()) == [0.0, 0.0] for line in axes.get_lines())  # the 0 line
    assert "test bits per byte on text" in axes.get_xlabel().replace("\n", " ")


def _tradeoff_x(figure) -> dict[str, float]:
    axes = figure.axes[0]
    return {c.get_label(): float(c.lines[0].get_xdata()[0]) for c in axes.containers}


def test_the_tradeoff_never_plots_a_perturbed_or_uncalibrated_speed():
    from xformer_bench.results.plots import draw_tradeoff
    from xformer_bench.results.speed import row_identity

    records = _study(KNOWN, perturbed=True)
    table, variants = _table(records)  # the runs' own, perturbed speeds; equal params
    assert draw_tradeoff(table, variants) is None

    table, variants = _table(_study(KNOWN, {"relu": 826112, "gelu": 900000, "swish": 1000000},
                                    perturbed=True))
    figure = draw_tradeoff(table, variants)  # against the parameters instead
    assert figure.axes[0].get_xlabel() == "parameters"
    assert _tradeoff_x(figure) == {"ReLU": 826112, "GeLU": 900000, "Swish": 1000000}
    assert "speed not shown" in figure.axes[0].get_title()

    timing = {}
    for k, activation in enumerate(KNOWN):
        config = next(r["config"] for r in records if r["choices"]["activation"] == activation)
        timing[row_identity(config)] = {"steps_per_sec": 10.0 + k, "iqr": 0.1,
                                        "rates": [10.0 + k] * 3, "repeats": 3, "steps": 10,
                                        "conditions": {"alone": activation != "swish"}}
    table, variants = _table(records, timing)  # calibrated; Swish's pass was perturbed
    figure = draw_tradeoff(table, variants)
    assert figure.axes[0].get_xlabel() == "training steps per second (calibrated timing pass)"
    assert _tradeoff_x(figure) == {"ReLU": 10.0, "GeLU": 11.0}
    assert "not drawn: Swish" in figure.axes[0].get_title().replace("\n", " ")
    own = {r["steps_per_sec"] for r in records}
    assert not own & set(_tradeoff_x(figure).values())
