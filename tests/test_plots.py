"""Plots stay readable at 30 rows and show the table's metric."""

from __future__ import annotations

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
