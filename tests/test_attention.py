"""Attention kernels: exactness against SDPA / a materialised reference, and causality --
every option at small boundaries (references.BOUNDARY_KWARGS), perturbed across them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from conftest import compose_config, declared_refusals
from references import (BOUNDARY_KEYS, BOUNDARY_KWARGS, BOUNDARY_SEQ_LEN,
                        masked_softmax_attention)
from xformer_bench.config import CONF_DIR
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.position import PairBias, Position
from xformer_bench.registry import ATTENTION, POSITION


@pytest.mark.parametrize("causal", [True, False])
def test_full_attention_equals_sdpa_and_explicit_softmax(tiny_dims, causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    kernel = ATTENTION.get("full")(tiny_dims)
    out = kernel(q, k, v, causal=causal)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, causal=causal),
                               atol=1e-5, rtol=1e-5)


def test_full_attention_with_additive_bias_matches_reference(tiny_dims):
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    bias = torch.randn(4, 16, 16)  # (H, T, S)
    out = ATTENTION.get("full")(tiny_dims)(q, k, v, causal=True, bias=PairBias.of_tensor(bias))
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, causal=True, bias=bias),
                               atol=1e-5, rtol=1e-5)


def _model(attention: str, position: str, dims: ModelDims) -> TransformerLM:
    torch.manual_seed(0)
    spec = {"name": attention, **BOUNDARY_KWARGS.get(attention, {})}
    return TransformerLM(dims, spec, {"name": "layernorm"}, {"name": "gelu"},
                         {"name": position}).eval()


def _yaml_keys(attention: str) -> set[str]:
    return set(yaml.safe_load((Path(CONF_DIR) / "attention" / f"{attention}.yaml").read_text()))


def test_every_option_with_a_boundary_has_small_boundary_kwargs():
    """A new option with a window, block, stride, chunk, cluster or kernel width cannot skip
    the causal-leak test at boundaries it crosses; an entry names only its YAML's keys."""
    for attention in ATTENTION.names():
        keys = _yaml_keys(attention)
        if keys & BOUNDARY_KEYS:
            assert attention in BOUNDARY_KWARGS, f"{attention}: {sorted(keys & BOUNDARY_KEYS)}"
    for attention, kwargs in BOUNDARY_KWARGS.items():
        assert set(kwargs) <= _yaml_keys(attention), attention


PERTURBED_FROM = (1, 4, 5, 10, 12, 15, 19)
"""First changed position: block and chunk edges (4, 12), window edges (5, 10, 15), inside a
block (1, 19), with boundaries of 3, 4 and 5 positions in BOUNDARY_SEQ_LEN = 20."""


@pytest.mark.parametrize("attention", ATTENTION.names())
@pytest.mark.parametrize("position", ["sinusoidal", "none"])
def test_changing_a_future_token_leaves_the_past_unchanged(attention, position):
    """The causal-leak test: outputs before position t are bit-identical whatever the tokens
    from t on, at sizes whose windows, blocks, strides, chunks and clusters the sequence
    crosses several times."""
    t_len = BOUNDARY_SEQ_LEN
    dims = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=t_len, vocab_size=256)
    spec = {"name": attention, **BOUNDARY_KWARGS.get(attention, {})}
    if "causal" not in build_token_mixer(spec, dims).provides:
        pytest.skip(f"attention={attention} is bidirectional only (refused in a causal LM)")
    assert_no_future_leak(_model(attention, position, dims), t_len)


def assert_no_future_leak(model: TransformerLM, t_len: int) -> None:
    """Outputs before each of PERTURBED_FROM are bit-identical when the tokens from it on
    change, and the outputs from it on do change."""
    tokens = torch.randint(0, 256, (2, t_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(tokens)
    for first in PERTURBED_FROM:
        changed = tokens.clone()
        changed[:, first:] = (changed[:, first:] + 17) % 256
        with torch.no_grad():
            after = model(changed)
        # exactly: a causal kernel's past never rounds through later values
        torch.testing.assert_close(before[:, :first], after[:, :first], atol=0, rtol=0,
                                   msg=lambda m, first=first: f"tokens changed from {first}: {m}")
        assert not torch.allclose(before[:, first:], after[:, first:]), "the future must matter"


def test_the_leak_check_catches_a_leak_across_a_block_boundary_only():
    """Planted: block_local whose last query of each block of 4 also reads, faintly (1e-6),
    the value of the next position -- the first of the next block."""
    dims = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=BOUNDARY_SEQ_LEN,
                     vocab_size=256)
    model = _model("block_local", "sinusoidal", dims)
    kernel = model.stack.blocks[0].attention.kernel
    honest = kernel.forward

    def leaking(q, k, v, **kwargs):  # (B, H, T, Dh)
        out = honest(q, k, v, **kwargs)
        at_block_end = (torch.arange(v.shape[-2]) % 4 == 3)[:, None]  # (T, 1)
        return out + 1e-6 * at_block_end * v.roll(-1, dims=-2)

    kernel.forward = leaking
    with pytest.raises(AssertionError, match="tokens changed from (4|12)"):
        assert_no_future_leak(model, BOUNDARY_SEQ_LEN)
    kernel.forward = honest
    assert_no_future_leak(model, BOUNDARY_SEQ_LEN)


def acts_inside_attention(position: str) -> bool:
    """Whether the scheme biases or rotates inside the mixer (else it only adds an embedding
    to its input, which no mixer can tell from any other input)."""
    built = POSITION.get(position)
    return isinstance(built, type) and (built.bias is not Position.bias
                                        or built.rotate is not Position.rotate)


PAIRED_POSITIONS = [p for p in POSITION.names() if acts_inside_attention(p)] + ["learned"]
"""The schemes that enter the mixer, plus one bounded embedding table: the embedding-only
schemes (sinusoidal, none, axial, factorized) are interchangeable for a mixer, and the
causal-leak test above runs every option with sinusoidal and none."""


def _pairs() -> list:
    """Every (attention, position) pair: a Latin-style cover runs in the fast suite -- option i
    of the attention registry with scheme i (cycled) of PAIRED_POSITIONS, so every option and
    every scheme, accepted and refused pairs alike, is checked at least once -- and the rest of
    the cross product under ``slow`` (``make test-full``)."""
    attentions = ATTENTION.names()
    cover = {(a, PAIRED_POSITIONS[i % len(PAIRED_POSITIONS)]) for i, a in enumerate(attentions)}
    return [pytest.param(a, p, id=f"{p}-{a}",
                         marks=() if (a, p) in cover else pytest.mark.slow)
            for p in PAIRED_POSITIONS for a in attentions]


def test_the_fast_pair_cover_includes_every_attention_and_every_position():
    fast = [case.values for case in _pairs() if not case.marks]
    assert {a for a, _ in fast} == set(ATTENTION.names())
    assert {p for _, p in fast} == set(PAIRED_POSITIONS)
    assert len(_pairs()) == len(ATTENTION.names()) * len(PAIRED_POSITIONS)


@pytest.mark.parametrize(("attention", "position"), _pairs())
def test_every_attention_position_pair_is_causal_or_refused_as_declared(attention, position):
    """Each pair either works (causal, finite gradients) or is refused at build time with the
    one line its parts' declared capabilities give -- never a crash in training."""
    config = compose_config(f"attention={attention}", f"position={position}", "data.seq_len=24",
                            "model.d_model=32", "model.n_heads=4", "model.n_layers=2",
                            "model.d_ff=64")
    refusals = declared_refusals(config)
    torch.manual_seed(0)
    if refusals:
        with pytest.raises(ConfigError) as refused:
            build_model(config, vocab_size=256)
        assert str(refused.value) == refusals[0]
        return
    model = build_model(config, vocab_size=256).eval()
    tokens = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 256
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :12], model(changed)[:, :12], atol=1e-5, rtol=1e-5)
    model(tokens).mean().backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_full_attention_with_more_keys_than_queries_and_padding(tiny_dims):
    """Memory / cross-attention shapes: 6 queries over 10 keys (the queries are the last 6
    positions), some keys padding; against the materialised reference."""
    torch.manual_seed(2)
    q = torch.randn(2, 4, 6, 8)  # (B, H, T, Dh)
    k, v = torch.randn(2, 2, 4, 10, 8).unbind(0)  # (B, H, S, Dh) each
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, :3] = True  # the oldest three keys of the second sequence
    kernel = ATTENTION.get("full")(tiny_dims)
    for causal in (True, False):
        torch.testing.assert_close(kernel(q, k, v, causal=causal),
                                   masked_softmax_attention(q, k, v, causal=causal),
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(kernel(q, k, v, causal=causal, key_padding_mask=padding),
                                   masked_softmax_attention(q, k, v, causal=causal,
                                                            padding=padding),
                                   atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_shared_key_value_heads_equal_attention_with_repeated_heads(tiny_dims, n_kv_heads):
    """Multi-query (1) and grouped-query (2) attention: every query head of a group attends
    with its group's one key/value head; at n_kv_heads = n_heads it is multi-head attention."""
    from xformer_bench.attention.full import FullAttention
    from xformer_bench.attention.multi_head import MultiHeadAttention
    from xformer_bench.core.context import ForwardContext

    torch.manual_seed(3)
    layer = MultiHeadAttention(tiny_dims, FullAttention(tiny_dims), n_kv_heads=n_kv_heads)
    d, dh, h = tiny_dims.d_model, tiny_dims.head_dim, tiny_dims.n_heads
    assert layer.qkv.weight.shape == ((h + 2 * n_kv_heads) * dh, d)
    x = torch.randn(2, 7, d)  # (B, T, D)
    q, k, v = layer.qkv(x).split([h * dh, n_kv_heads * dh, n_kv_heads * dh], dim=-1)
    heads = lambda y: y.view(2, 7, -1, dh).transpose(1, 2)  # noqa: E731
    group = h // n_kv_heads
    k = heads(k)[:, [i // group for i in range(h)]]  # (B, H, T, Dh): head i uses kv head i // g
    v = heads(v)[:, [i // group for i in range(h)]]
    y = masked_softmax_attention(heads(q), k, v, causal=True)  # (B, H, T, Dh)
    expected = layer.out(y.transpose(1, 2).reshape(2, 7, d))
    torch.testing.assert_close(layer(x, ForwardContext(Position())), expected, atol=1e-5, rtol=1e-5)
