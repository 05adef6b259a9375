"""Equal compute instead of equal steps: each row's trainer.max_steps derived from a token or
FLOP budget (:mod:`xformer_bench.training.equal_compute`), and the table's note."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from conftest import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.results.equal_compute_note import equal_compute_sentence
from xformer_bench.training.equal_compute import apply_equal_compute, step_flops

SMALL = ("model.d_model=32", "model.n_layers=1", "model.n_heads=2", "data.seq_len=32",
         "data.batch_size=4")


def derived(*overrides: str) -> dict:
    return apply_equal_compute(compose_config(*overrides), [])


def test_a_token_budget_derives_each_rows_max_steps_from_its_batch():
    budget = "+equal_compute={tokens:100000}"
    short = derived(*SMALL, budget)
    long = derived(*SMALL, "data.seq_len=64", "data.batch_size=3", budget)
    assert short["trainer"]["max_steps"] == 100000 // (4 * 32) == 781
    assert long["trainer"]["max_steps"] == 100000 // (3 * 64) == 520
    assert short["equal_compute"]["result"] == {"max_steps": 781, "tokens_per_step": 128}
    accumulated = derived(*SMALL, "trainer.accumulate_grad_batches=2", budget)
    assert accumulated["trainer"]["max_steps"] == 100000 // 256


def test_no_budget_leaves_the_config_as_it_is():
    config = compose_config(*SMALL)
    assert apply_equal_compute(config, ["trainer.max_steps=5"]) is config


def test_a_flop_budget_gives_a_bigger_model_fewer_steps():
    budget = 1e10
    small = compose_config(*SMALL, "model.d_ff=512", f"+equal_compute={{flops:{budget:.0f}}}")
    big = compose_config(*SMALL, "model.d_ff=1024", f"+equal_compute={{flops:{budget:.0f}}}")
    steps = []
    for config in (small, big):
        per_step = step_flops(config)
        got = apply_equal_compute(config, [])["trainer"]["max_steps"]
        assert got * per_step <= budget < (got + 1) * per_step
        steps.append(got)
    assert steps[1] < steps[0]


def test_an_explicit_max_steps_beside_the_budget_is_refused_in_one_line():
    config = compose_config(*SMALL, "trainer.max_steps=7", "+equal_compute={tokens:100000}")
    with pytest.raises(ConfigError) as refused:
        apply_equal_compute(config, [*SMALL, "trainer.max_steps=7"])
    assert "remove trainer.max_steps=" in str(refused.value) and "\n" not in str(refused.value)


def test_a_budget_below_one_step_is_refused():
    with pytest.raises(ConfigError, match="trainer.max_steps would be 0") as refused:
        derived(*SMALL, "+equal_compute={tokens:100}")
    assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="one budget"):
        derived(*SMALL, "+equal_compute={tokens:100,flops:5}")


def test_the_table_caption_says_equal_compute():
    from xformer_bench.results.aggregate import build_table
    from xformer_bench.results.collect import collect
    from xformer_bench.results.table import caption
    from xformer_bench.results.variants import group_variants

    shipped = Path(__file__).resolve().parent.parent / "results" / "reference"
    records = collect(shipped / "narang_activations_300_steps_tinyshakespeare" / "records")
    runs = [copy.deepcopy(r) for r in records.of("narang_activations")
            if r["choices"].get("activation") in ("relu", "gelu")]
    for run in runs:
        steps = 300 if run["choices"]["activation"] == "relu" else 250
        run["config"]["equal_compute"] = {"tokens": 1_000_000, "result": {
            "max_steps": steps, "tokens_per_step": 3000}}
    variants = group_variants(runs)
    sentence = equal_compute_sentence(variants)
    assert sentence.startswith("equal compute: 1,000,000 tokens per row (max_steps derived "
                               "per row: ")
    assert "300" in sentence and "250" in sentence
    table = build_table("narang_activations", variants, baseline={"activation": "relu"})
    assert sentence in table.notes
    assert sentence in caption(table, " ± ", "-")
    assert equal_compute_sentence(group_variants(
        [r for r in records.of("narang_activations")])) is None
