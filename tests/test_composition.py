"""Every option composes with every other: a seeded sample of the cross product of the
component groups (``slow``: make test-full), plus every option of every group at least once,
each trained 2 steps -- unless the parts' declared capabilities refuse the combination, which
must then be exactly one ConfigError line at build time (the declarations are read here from
each part built on its own, so a refusal nobody declared, or a declared one the model does not
make, fails)."""

from __future__ import annotations

import random

import pytest
import torch

from conftest import compose_config, declared_refusals, two_training_steps
from xformer_bench.config import CONF_DIR, PLUMBING_GROUPS, choice_groups
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model

GROUPS = tuple(g for g in choice_groups() if g not in PLUMBING_GROUPS)  # model-shaping groups
OPTIONS = {g: sorted(p.stem for p in (CONF_DIR / g).glob("*.yaml")) for g in GROUPS}
SMALL = ("data.seq_len=16", "model.d_model=32", "model.n_heads=2", "model.d_ff=64")


def _combinations(n_random: int = 12, seed: int = 0) -> list[dict[str, str]]:
    rng = random.Random(seed)
    width = max(len(options) for options in OPTIONS.values())
    # Latin-style cover: combination i takes option i of every group (cycled), so every option
    # of every group appears at least once; then random draws from the full cross product.
    cover = [{g: OPTIONS[g][i % len(OPTIONS[g])] for g in GROUPS} for i in range(width)]
    sample = [{g: rng.choice(OPTIONS[g]) for g in GROUPS} for _ in range(n_random)]
    return cover + sample


def test_the_cover_includes_every_option_of_every_group():
    combos = _combinations()
    for group, options in OPTIONS.items():
        assert {c[group] for c in combos} == set(options)


def _cases(n_cover: int = len(_combinations(n_random=0))) -> list:
    """The cover in the fast suite; the random draws from the cross product under ``slow``."""
    return [pytest.param(combo, id="-".join(combo.values()),
                         marks=() if i < n_cover else pytest.mark.slow)
            for i, combo in enumerate(_combinations())]


@pytest.mark.parametrize("combo", _cases())
def test_combination_builds_and_trains_two_steps(combo):
    config = compose_config(*(f"{g}={o}" for g, o in combo.items()), *SMALL)
    refusals = declared_refusals(config)
    torch.manual_seed(0)
    if refusals:
        with pytest.raises(ConfigError) as refused:
            build_model(config, vocab_size=256)
        assert str(refused.value) == refusals[0] and "\n" not in refusals[0]
        assert "choose another" in refusals[0]
        return
    model = build_model(config, vocab_size=256)
    losses = two_training_steps(model, length=16)
    assert all(torch.isfinite(torch.tensor(losses)))
    assert losses[1] != losses[0], "the step must change the model"


def test_the_known_refusals_are_declared():
    """The two combinations known to be impossible stay refused, by declaration."""
    fixup_pkm = compose_config("norm=fixup", "ffn=product_key_memory", *SMALL)
    assert any("norm=fixup needs a residual output layer" in m for m in declared_refusals(fixup_pkm))
    shared_powernorm = compose_config("norm=powernorm", "model=shared_blocks", *SMALL)
    assert declared_refusals(shared_powernorm) == [
        "norm=powernorm needs a block of its own at every depth: model.share_blocks would mix "
        "every depth into one running statistic, which model.share_blocks=true does not provide; "
        "choose another norm or model"]
    assert declared_refusals(compose_config(*SMALL)) == []
