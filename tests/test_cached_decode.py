"""Cached decoding: for every attention option whose causal LM ``cache_blocker``
admits, the log-probabilities decoded through the key/value cache -- one token a step, or a
prompt of several tokens and then one a step -- equal one forward pass over the sequence, at
settings whose windows, blocks, strides, chunks and clusters the sequence crosses several
times (the decode steps then start mid-block, as sampling's do)."""

from __future__ import annotations

import copy
import functools

import pytest
import torch
import yaml

from conftest import compose_config, seeded_tokens
from references import BOUNDARY_KEYS, BOUNDARY_KWARGS, BOUNDARY_SEQ_LEN, decode_step_by_step
from xformer_bench.config import CONF_DIR
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.models.cached_decoding import cache_blocker
from xformer_bench.registry import ATTENTION

CACHEABLE = ("retnet", "gla", "mamba2", "s4d", "hyena", "deltanet", "gated_deltanet", "block_local", "dilated", "fixed", "full", "gaussian_prior", "grouped_query",
             "linear", "local", "longformer", "memory_compressed", "multi_query", "performer",
             "persistent_memory", "routing", "strided", "talking_heads")
"""The options whose causal LM ``cache_blocker`` admits (checked below: no more, no fewer)."""

SETTINGS = {name: BOUNDARY_KWARGS.get(name, {}) for name in CACHEABLE}
"""Their YAML keys shrunk so that BOUNDARY_SEQ_LEN positions cross 4-7 windows, blocks,
strides, chunks or cluster blocks (:data:`references.BOUNDARY_KWARGS`, shared with the other
equivalence tests: e.g. block_local block 4 / memory 4, local window 5, routing 3 clusters with
blocks of 4 keys and local blocks of 4); an option without a boundary keeps its defaults."""

LENGTH = BOUNDARY_SEQ_LEN

DIMS = ("model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64",
        f"data.seq_len={LENGTH}")


@functools.cache
def base_config() -> dict:
    return compose_config(*DIMS)


def lm(name: str):
    """The causal LM with attention ``name`` at the table's settings, weights drawn from seed 0,
    in eval: the attention group as ``attention=name attention.KEY=VALUE`` composes it (its
    YAML, the settings over it; composing once for all options keeps the test fast)."""
    config = copy.deepcopy(base_config())
    config["attention"] = yaml.safe_load((CONF_DIR / "attention" / f"{name}.yaml").read_text())
    settings = SETTINGS.get(name, {})
    assert set(settings) <= set(config["attention"]), f"not keys of attention={name}"
    config["attention"].update(settings)
    torch.manual_seed(0)
    return build_model(config, vocab_size=64).eval()


def cached_decode_error(model, prefix: int) -> float:
    """max |log-prob difference| between decoding through the cache (``prefix`` tokens in the
    first step, then one a step) and the forward pass."""
    tokens = seeded_tokens(batch=2, length=LENGTH, vocab_size=64)
    with torch.no_grad():
        full = model(tokens)  # (B, T, V)
    return (decode_step_by_step(model, tokens, prefix=prefix) - full).abs().max().item()


@pytest.mark.parametrize("prefix", [1, 7])  # 7: a first step that ends mid-block
@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_cached_decoding_scores_as_the_forward_pass(name, prefix):
    model = lm(name)
    assert cache_blocker(model) is None
    assert cached_decode_error(model, prefix) < 1e-4


def test_the_table_holds_exactly_the_options_that_decode_with_the_cache():
    """A new option the cache admits needs its row (and boundary-crossing settings); an option
    refused since needs none."""
    admitted = set()
    for name in ATTENTION.names():
        try:
            model = lm(name)
        except ConfigError:  # not a causal option: no decoder LM
            continue
        if cache_blocker(model) is None:
            admitted.add(name)
    assert admitted == set(CACHEABLE)


@pytest.mark.parametrize("name", sorted(set(CACHEABLE) - set(BOUNDARY_KWARGS)))
def test_an_option_at_its_defaults_has_no_boundary_to_cross(name):
    yaml_keys = yaml.safe_load((CONF_DIR / "attention" / f"{name}.yaml").read_text())
    assert not BOUNDARY_KEYS & set(yaml_keys)


@pytest.fixture
def blocks_from_the_first_query(monkeypatch):
    """Plant the old layout of the windowed kernels' shared windows: blocks cut from the
    first query given (a one-query decode step got a block of its own) instead of at
    absolute positions."""
    from xformer_bench.attention._ops import window as _window

    caches = (_window._pairs, _window._floor_mask, _window._window_index)
    for cache in caches:
        cache.cache_clear()  # layouts cached under the correct geometry
    monkeypatch.setattr(_window._Blocks, "front", property(lambda layout: layout.offset % layout.d))
    yield
    monkeypatch.undo()
    for cache in caches:
        cache.cache_clear()


def test_blocks_laid_out_from_the_first_query_fail_the_comparison(blocks_from_the_first_query):
    assert cached_decode_error(lm("block_local"), prefix=1) > 1e-2
    assert cached_decode_error(lm("local"), prefix=1) < 1e-4  # a sliding band: any layout
