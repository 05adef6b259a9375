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
