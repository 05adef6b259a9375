"""Rows whose last validation is well above an earlier one (:mod:`xformer_bench.results.late_rise`):
found from the records' curves and named under the table."""

from __future__ import annotations

import pytest

from test_same_computation import PAIR, composed, record_of, tables_of
from xformer_bench.results.late_rise import RISE, Rise, late_rise


def curve(*losses: float, every: int = 250) -> list[dict]:
    return [{"step": every * (i + 1), "val/loss": loss} for i, loss in enumerate(losses)]


@pytest.mark.parametrize("losses,expected", [
    ((2.2, 1.61, 1.60, 2.87), Rise(2.87, 1000, 1.60, 750)),  # Performer's redraw before the end
    ((2.2, 1.61, 1.60, 1.60 * (1 + RISE) * 1.001), Rise(1.60 * (1 + RISE) * 1.001, 1000, 1.60, 750)),
    ((2.2, 1.61, 1.60, 1.60 * (1 + RISE) * 0.999), None),  # within 5 %: noise, overfitting's start
    ((2.2, 1.9, 1.7, 1.5), None),  # still falling
    ((1.5,), None),  # one validation: nothing to compare
])
def test_a_run_has_risen_when_its_last_loss_is_5_percent_above_its_lowest(losses, expected):
    record = {"history": curve(*losses)[::-1]}  # the order of the points does not matter
    assert late_rise(record) == expected


def test_the_table_names_the_row_that_rose_and_not_the_one_that_did_not(tmp_path):
    records = []
    for label, config in composed(PAIR):
        for seed in (0, 1):
            records.append(record_of(config, seed))
            rose = label == "Untied embeddings" and seed == 1
            records[-1]["history"] = curve(2.4, 1.9, 1.7, 2.4 if rose else 1.6)
    tables, lines = tables_of(tmp_path, records)
    said = ("Rose at the end (last validation loss more than 5% above an earlier one): Untied "
            "embeddings (1 of 2 runs; at most 2.400 at step 1000 against 1.700 at step 750): "
            "the final number is not where training had the model; read its curve.")
    assert said in tables["one_model_fixture.md"]
    assert "Rose at the end" in tables["one_model_fixture.tex"]
    assert sum(said in line for line in lines) == 1
    assert not any("Tied encoder/decoder input embeddings (" in line for line in lines)


def test_a_run_that_rose_says_so_after_its_final_line(capsys):
    from xformer_bench.job import _report

    record = record_of(composed({"Untied embeddings"})[0][1], 0) | {"record_path": "r.json",
                                                                   "tokens_per_sec": 1.0}
    for losses, warned in (((2.2, 1.6, 1.65), False), ((2.2, 1.6, 2.4), True)):
        record["history"] = curve(*losses)
        _report(record)
        out = capsys.readouterr().out.splitlines()
        assert out[0].startswith(f"[xbench] {record['run_id']}: final val bpb")
        assert (out[2:] == ["[xbench] warning: the last validation loss (2.400, step 750) is "
                            "50% above its lowest (1.600, step 500; more than 5%): read the "
                            "curve before the final number"]) == warned
        assert len(out) == 2 + warned
