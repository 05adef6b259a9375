"""What parameter matching changes is named (``results/confounds.py``), and ``match_params:
{by: mixer}`` re-solves the mixer's own width instead of the feed-forward's
(``models/param_match.py``).  Matching by d_ff gives RetNet and Mamba-2 about half of full
attention's feed-forward at d_model 128 (259 and 246 against 512): the table says so."""

from __future__ import annotations

import pytest

from conftest import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.models.param_match import BY, describe, match_params
from xformer_bench.results import record as records
from xformer_bench.results.confounds import differences, summary, undeclared
from xformer_bench.schema import check_config
from xformer_bench.schema.top import MATCH_BY

SIZES = ("model.d_model=64", "model.n_heads=4", "model.n_layers=2", "model.d_ff=256",
         "data.seq_len=32")
MATCH = "+match_params={reference: {attention: full}, tolerance: 0.02%s}"


def _matched(attention: str, by: str | None = None) -> dict:
    overrides = (*SIZES, f"attention={attention}", MATCH % (f", by: {by}" if by else ""))
    config = compose_config(*overrides)
    check_config(config)
    return match_params(config, list(overrides))


def _params(config: dict) -> int:
    return build_model(config, 256).num_parameters()


def _record(config: dict) -> dict:
    """What the table reads of a finished run of ``config``."""
    choices = {"model": "vanilla", "attention": config["attention"]["name"], "data": "text"}
    return {"choices": choices, "config": config, "params": _params(config),
            "eval_protocol": None}


def test_by_mixer_keeps_the_feed_forward_and_re_solves_the_mixers_width():
    """RetNet's W_V, W_G, W_O are 3 x 2d^2 against full attention's 2d^2 for W_V, W_O: by
    mixer its value width shrinks to 44 channels (11 a head) and d_ff stays 256; by d_ff
    (the default) the feed-forward gives way instead."""
    full = _params(compose_config(*SIZES))
    mixer, by_ff = _matched("retnet", "mixer"), _matched("retnet")
    assert mixer["model"]["d_ff"] == 256 and mixer["attention"]["expand_v"] == 44 / 64
    assert abs(_params(mixer) / full - 1) <= 0.02
    result = mixer["match_params"]["result"]
    assert result["status"] == "matched" and result["by"] == "mixer"
    assert (result["width"], result["width_default"], result["width_value"]) == (
        "attention.expand_v", 2, 0.6875)
    assert describe(result).startswith("params matched to") and \
        "attention.expand_v 2 -> 0.6875" in describe(result)
    assert by_ff["model"]["d_ff"] < 256 / 2 + 10 and by_ff["attention"]["expand_v"] == 2
    assert abs(_params(by_ff) / full - 1) <= 0.02


def test_by_mixer_refuses_an_option_that_declares_no_width():
    with pytest.raises(ConfigError, match=r"^match_params.by=mixer: attention=mamba2 declares "
                                          r"no width of its own"):
        _matched("mamba2", "mixer")
    local = _matched("local", "mixer")  # already within the tolerance: nothing to re-solve
    assert local["match_params"]["result"]["status"] == "matched"
    assert local["model"]["d_ff"] == 256


def test_by_is_optional_and_d_ff_by_default_so_run_ids_are_unchanged():
    choices = {"model": "vanilla", "attention": "retnet"}
    plain, explicit = _matched("retnet"), _matched("retnet", "d_ff")
    assert plain["model"] == explicit["model"]
    assert records.run_identity(plain, choices) == records.run_identity(explicit, choices)
    assert BY == MATCH_BY
    with pytest.raises(ConfigError, match=r"match_params.by=nope is not one of its choices"):
        check_config(compose_config(*SIZES, MATCH % ", by: nope"))


def test_the_confounds_name_the_feed_forward_the_match_changed():
    """By d_ff, the RetNet row is named with its re-solved width against the baseline's; the
    change is the study's own (match_params declares it): listed, not marked."""
    base, retnet = (_record(_matched(a)) for a in ("full", "retnet"))
    d_ff = retnet["config"]["model"]["d_ff"]
    found = differences(retnet, base, named=["attention"])
    assert [d.text for d in found] == [f"d_ff {d_ff} (baseline 256)"]
    assert summary(found) == f"also d_ff {d_ff} (baseline 256)" and undeclared(found) == []
    assert differences(base, base, named=["attention"]) == []


def test_the_confounds_name_the_mixer_width_the_match_changed():
    base, retnet = (_record(_matched(a, "mixer")) for a in ("full", "retnet"))
    found = differences(retnet, base, named=["attention"])
    assert [d.text for d in found] == ["expand_v 0.6875 (default 2)"] and undeclared(found) == []


def test_a_swept_presets_own_sizes_are_its_own_but_what_the_match_changed_is_named():
    """A row named by its model preset: its own d_ff is the row's; a d_ff or d_model the match
    re-solved is named against the baseline's (systems_lm's Universal Transformer, d_ff 2826,
    and all-attention, d_model 84, were unnamed), declared by the match (never marked)."""
    base = _record(_matched("full"))
    own = _record(_matched("full"))
    own["choices"] = {**own["choices"], "model": "vanilla_b"}
    own["config"]["model"]["d_ff"] = 1024  # the preset's own width, left by the match
    assert differences(own, base, named=["model"]) == []
    re_solved = _record(_matched("retnet"))
    re_solved["choices"] = {**re_solved["choices"], "model": "vanilla_b"}
    d_ff = re_solved["config"]["model"]["d_ff"]
    found = differences(re_solved, base, named=["model", "attention"])
    assert [d.text for d in found] == [f"d_ff {d_ff} (baseline 256)"] and undeclared(found) == []
    result = re_solved["config"]["match_params"]["result"]
    result.update(d_model=48, d_model_default=64)
    re_solved["config"]["model"]["d_model"] = 48
    found = differences(re_solved, base, named=["model", "attention"])
    assert [d.text for d in found] == ["d_model 48 (baseline 64)", f"d_ff {d_ff} (baseline 256)"]
    assert undeclared(found) == []


def test_a_d_model_the_match_re_solved_is_named_once_and_declared():
    """A row named by its option (attention_zoo's persistent memory): a re-solved d_model was
    listed as an undeclared ``model.d_model=72``; it is the match's, named once, declared.  A
    d_model the match did not move stays an undeclared difference."""
    base, row = (_record(_matched(a)) for a in ("full", "retnet"))
    row["config"]["model"]["d_model"] = 48
    found = differences(row, base, named=["attention"])
    assert [d.text for d in found][0] == "model.d_model=48" and undeclared(found)
    row["config"]["match_params"]["result"].update(d_model=48, d_model_default=64)
    found = differences(row, base, named=["attention"])
    assert [d.text for d in found][0] == "d_model 48 (baseline 64)" and undeclared(found) == []
    assert len(found) == 2
