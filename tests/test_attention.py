"""Attention kernels: exactness against SDPA / a materialised reference, and causality."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from xformer_bench.models.dims import ModelDims
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.registry import ATTENTION, POSITION


def _explicit_attention(q, k, v, causal, bias=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, T, S)
    if bias is not None:
        scores = scores + bias
    if causal:
        t = q.shape[-2]
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize("causal", [True, False])
def test_full_attention_equals_sdpa_and_explicit_softmax(tiny_dims, causal):
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    kernel = ATTENTION.get("full")(tiny_dims)
    out = kernel(q, k, v, causal=causal)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=causal))
    torch.testing.assert_close(out, _explicit_attention(q, k, v, causal), atol=1e-5, rtol=1e-5)


def test_full_attention_with_additive_bias_matches_reference(tiny_dims):
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 16, 8).unbind(0)
    bias = torch.randn(4, 16, 16)  # (H, T, S)
    out = ATTENTION.get("full")(tiny_dims)(q, k, v, causal=True, bias=bias)
    torch.testing.assert_close(out, _explicit_attention(q, k, v, True, bias), atol=1e-5, rtol=1e-5)


def _model(attention: str, position: str, dims: ModelDims) -> TransformerLM:
    torch.manual_seed(0)
    return TransformerLM(dims, {"name": attention}, {"name": "layernorm"}, {"name": "gelu"},
                         {"name": position}).eval()


@pytest.mark.parametrize("attention", ATTENTION.names())
@pytest.mark.parametrize("position", ["sinusoidal", "none"])
def test_changing_a_future_token_leaves_the_past_unchanged(attention, position):
    """The causal-leak test: outputs up to t must not depend on token t+1 or later."""
    dims = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=32, vocab_size=256)
    model = _model(attention, position, dims)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    for t in (0, 7, 30):
        changed = tokens.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] + 17) % 256
        with torch.no_grad():
            before, after = model(tokens), model(changed)
        torch.testing.assert_close(before[:, : t + 1], after[:, : t + 1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(before[:, t + 1:], after[:, t + 1:]), "the future must matter"


@pytest.mark.parametrize("position", POSITION.names())
def test_every_position_is_causal_with_full_attention(position):
    dims = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=24, vocab_size=256)
    model = _model("full", position, dims)
    tokens = torch.randint(0, 256, (1, 24), generator=torch.Generator().manual_seed(1))
    changed = tokens.clone()
    changed[:, 12] = (changed[:, 12] + 1) % 256
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :12], model(changed)[:, :12], atol=1e-5, rtol=1e-5)
