"""The sparse-attention building block: listing every key reproduces dense attention (causal,
biased, padded, more keys than queries); listed subsets equal dense attention under the same
mask; a query with no valid key gives 0 and finite gradients."""

from __future__ import annotations

import math

import pytest
import torch

from references import band_mask, causal_mask, masked_softmax_attention
from xformer_bench.attention._ops.sparse import block_sparse_attention, masked_attention
from xformer_bench.position import PairBias


def qkv(t=10, s=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, t, 8, generator=g), torch.randn(2, 3, s, 8, generator=g),
            torch.randn(2, 3, s, 8, generator=g))


@pytest.mark.parametrize(("t", "s", "block"), [(10, 10, 4), (6, 11, 3), (7, 7, 7)])
@pytest.mark.parametrize("per_query", [False, True])
def test_listing_every_key_is_dense_attention(t, s, block, per_query):
    q, k, v = qkv(t, s)
    n_blocks = math.ceil(t / block)
    every = torch.arange(s).expand(n_blocks, s)
    index = every[:, None, :].expand(n_blocks, block, s) if per_query else every
    out = block_sparse_attention(q, k, v, index, block, causal=True)
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, causal_mask(t, s)),
                               atol=1e-5, rtol=1e-5)
    out = block_sparse_attention(q, k, v, index, block, causal=False)
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v), atol=1e-5, rtol=1e-5)


def test_bias_and_padding_on_the_listed_pairs():
    q, k, v = qkv(9, 12, seed=1)
    bias = torch.randn(3, 9, 12)  # (H, T, S)
    padding = torch.zeros(2, 12, dtype=torch.bool)
    padding[0, 2:5] = True
    index = torch.arange(12).expand(3, 12)  # 3 blocks of 3 queries, every key
    out = block_sparse_attention(q, k, v, index, 3, causal=True, bias=PairBias.of_tensor(bias),
                                 key_padding_mask=padding)
    expected = masked_softmax_attention(q, k, v, causal=True, bias=bias, padding=padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_a_band_of_listed_keys_equals_dense_attention_under_the_band_mask():
    t, w, block = 12, 3, 3
    q, k, v = qkv(t, t, seed=2)
    # block n covers queries 3n..3n+2; list keys 3n-3 .. 3n+2 (previous block + own), -1 off the edge
    index = torch.arange(-block, block)[None, :] + block * torch.arange(t // block)[:, None]
    index = index.masked_fill(index < 0, -1)
    band = lambda i, j: (j <= i) & (j > i - w)  # noqa: E731 -- the previous w keys, self included
    out = block_sparse_attention(q, k, v, index, block, causal=True, allowed=band)
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, band_mask(t, t, w - 1)),
                               atol=1e-5, rtol=1e-5)


def test_a_query_with_no_valid_key_gives_zero_and_finite_gradients():
    q, k, v = (x.requires_grad_() for x in qkv(4, 4, seed=3))
    padding = torch.zeros(2, 4, dtype=torch.bool)
    padding[1, 0] = True  # causal query 0 of sequence 1 sees only key 0: padding
    out = block_sparse_attention(q, k, v, torch.arange(4).expand(1, 4), 4, causal=True,
                                 key_padding_mask=padding)
    assert torch.equal(out[1, :, 0], torch.zeros(3, 8))
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_masked_attention_log_normaliser():
    q, k, v = qkv(5, 7, seed=4)
    valid = torch.ones(5, 7, dtype=torch.bool)
    out, lse = masked_attention(q, k, v, valid)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(8)
    torch.testing.assert_close(lse, scores.logsumexp(-1))
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v), atol=1e-5, rtol=1e-5)
