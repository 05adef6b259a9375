"""Parameter matching (match_params): d_ff re-solved so a variant has the reference's count."""

from __future__ import annotations

import pytest

from conftest import TINY_RUN, compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.models.param_match import count_parameters, match_params, reference_overrides
from xformer_bench.results import record as records

MATCH = "+match_params={reference: {attention: full}, tolerance: 0.02}"
VANILLA = "+match_params={reference: {model: vanilla}, tolerance: 0.02}"
SIZES = ("model.d_model=64", "model.n_heads=4", "model.n_layers=2", "model.d_ff=256",
         "data.seq_len=32")


def _params(config: dict, vocab_size: int = 256) -> int:
    return build_model(config, vocab_size).num_parameters()


def _matched(*overrides: str) -> dict:
    """What a run of ``xbench OVERRIDES`` trains after the match."""
    return match_params(compose_config(*overrides), list(overrides))


@pytest.mark.parametrize("attention, widens", [("multi_query", True), ("gmlp", False),
                                               ("lsh", True), ("mixer", True)])
def test_a_variant_is_brought_within_the_tolerance_by_its_feed_forward(attention, widens):
    full = _params(compose_config(*SIZES))
    unmatched = compose_config(*SIZES, f"attention={attention}")
    matched = _matched(*SIZES, f"attention={attention}", MATCH)
    assert abs(_params(unmatched) / full - 1) > 0.02  # the premise: a real gap to close
    assert (matched["model"]["d_ff"] > 256) == widens
    for vocab in (256, 50_000):  # the solved width does not depend on the vocabulary
        reference = _params(compose_config(*SIZES), vocab)
        assert abs(_params(matched, vocab) / reference - 1) <= 0.02
    result = matched["match_params"]["result"]
    assert result["status"] == "matched" and result["d_ff"] == matched["model"]["d_ff"]
    assert result["reference_params"] == full


def test_a_variant_within_the_tolerance_keeps_its_width_and_its_run_id():
    plain = compose_config(*SIZES, "attention=local")
    matched = _matched(*SIZES, "attention=local", MATCH)
    assert matched["model"]["d_ff"] == 256
    choices = {"model": "vanilla", "attention": "local"}
    assert records.run_identity(matched, choices) == records.run_identity(plain, choices)


def test_a_gap_the_feed_forward_cannot_close_is_closed_by_d_model():
    """Persistent memory's vectors (d_ff would have to be negative), no feed-forward at all
    (nothing depends on d_ff), GTrXL's gates: d_model is re-solved, in steps of n_heads, d_ff
    kept at the preset's ratio (or as it is, when it counts for nothing)."""
    for overrides, reference in ((("attention=persistent_memory",), full_ref := MATCH),
                                 (("attention=multi_query", "ffn=none"), full_ref),
                                 (("model=gtrxl",), VANILLA)):
        matched = _matched(*SIZES, *overrides, reference)
        result = matched["match_params"]["result"]
        target = result["reference_params"]  # the reference keeps ffn=none where the run does
        assert result["status"] == "matched" and result["d_model"] != 64, overrides
        assert matched["model"]["d_model"] == result["d_model"]
        assert matched["model"]["d_model"] % 4 == 0  # n_heads divides it
        assert abs(_params(matched) / target - 1) <= 0.02
    no_ffn = _matched(*SIZES, "attention=multi_query", "ffn=none", MATCH)
    assert no_ffn["model"]["d_ff"] == 256  # untouched: nothing depends on it


def test_a_gap_no_width_can_close_is_reported_and_the_run_keeps_its_defaults():
    """All-attention with rotary positions at vanilla's size: no feed-forward, and the even
    head widths d_model = 80 and 88 miss 5 % on either side."""
    request = "+match_params={reference: {model: vanilla}, tolerance: 0.05}"
    matched = _matched("model=all_attention", "position=rotary", request)
    result = matched["match_params"]["result"]
    assert result["status"] == "unmatched" and result["gap"] > 0.5
    assert "do not depend on model.d_ff" in result["reason"]
    assert "nor any model.d_model (nearest 88: +5.4 %)" in result["reason"]
    assert (matched["model"]["d_model"], matched["model"]["d_ff"]) == (128, 512)


def test_counting_on_the_meta_device_agrees_with_a_built_model():
    for attention in ("full", "performer", "synthesizer"):  # performer falls back to the CPU
        config = compose_config(*SIZES, f"attention={attention}")
        assert count_parameters(config) == _params(config)


@pytest.mark.parametrize("request_, message", [
    ("+match_params={reference: {attention: full}}", "needs reference"),
    ("+match_params={reference: {attention: nope}, tolerance: 0.02}", "attention=nope"),
])
def test_a_malformed_request_is_one_config_error(request_, message):
    with pytest.raises(ConfigError, match=message):
        _matched(*SIZES, request_)


def test_the_reference_is_the_run_with_the_reference_choices():
    overrides = ["model=reformer", "model.d_model=64", "attention.n_hashes=2", "seed=1",
                 "attention=lsh", "stack.ffn_chunks=2"]
    assert reference_overrides(overrides, {"model": "vanilla", "attention": "full"}) == [
        "model.d_model=64", "seed=1", "stack.ffn_chunks=2", "model=vanilla", "attention=full"]


def test_a_system_preset_is_matched_to_vanilla():
    """One shared block for two layers: the feed-forward widens to make up."""
    request = "+match_params={reference: {model: vanilla}, tolerance: 0.05}"
    matched = _matched(*SIZES, "model=universal_transformer", request)
    vanilla = _params(compose_config(*SIZES))
    assert matched["model"]["d_ff"] > 2 * 256
    assert abs(_params(matched) / vanilla - 1) <= 0.05


def test_a_study_run_records_the_match(tmp_path, capsys):
    """Through the CLI's job path: the solved width is trained and kept in the record."""
    from xformer_bench.cli import run_job

    overrides = (*TINY_RUN, f"paths.results_dir={tmp_path / 'results'}",
                 "attention=multi_query", MATCH)
    config = compose_config(*overrides)
    run_job(config, {"model": "vanilla", "attention": "multi_query"}, list(overrides),
            tmp_path / "run", multirun=False)
    assert "params matched to" in capsys.readouterr().out
    [path] = (tmp_path / "results" / "default").glob("*.json")
    record = records.load(path)
    result = record["config"]["match_params"]["result"]
    assert result["status"] == "matched" and record["status"] == "finished"
    assert record["config"]["model"]["d_ff"] == result["d_ff"] > 64  # TINY_RUN's d_ff, widened
    full = _params(compose_config(*TINY_RUN))
    assert abs(record["params"] / full - 1) <= 0.02
