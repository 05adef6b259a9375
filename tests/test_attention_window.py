"""The window family -- local, block_local, dilated, longformer, bigbird -- against dense softmax
attention under the same explicit mask (:mod:`references`, on small T): causal and
bidirectional, lengths that are no multiple of a block, more keys than queries (the queries the
last T: block-local's blocks at absolute positions), an additive bias and key padding; local
with a window of T or more is full attention; BigBird's random blocks are fixed per layer and
causal."""

from __future__ import annotations

import math

import pytest
import torch

from references import band_mask, causal_mask, masked_softmax_attention, query_key_positions
from xformer_bench.attention._ops.window import window_reach
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=64, vocab_size=256)


def qkv(t, s, seed=0, heads=4):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, heads, n, 8, generator=g) for n in (t, s, s)]


def band(t, s, window, causal, dilation=1):
    return band_mask(t, s, *window_reach(window, causal), dilation)


def with_global(allowed, t, s, n_global):
    p, j = query_key_positions(t, s)
    return allowed | (j < n_global) | (p < n_global)  # attended by all, attending all


def block_local_mask(t, s, block, memory, causal):
    """Blocks at absolute positions: query p's block starts at p // block * block."""
    p, j = query_key_positions(t, s)
    first = p // block * block  # position of the block's first query
    return (j >= first - memory) & (j < first + block + (0 if causal else memory))


CASES = {  # name, kwargs, explicit mask (t, s, causal) -- before the causal cut
    "local": ({"window": 5}, lambda t, s, c: band(t, s, 5, c)),
    "dilated": ({"window": 4, "dilation": 3}, lambda t, s, c: band(t, s, 4, c, 3)),
    "longformer": ({"window": 6, "n_global": 3, "dilation": 2},
                   lambda t, s, c: with_global(band(t, s, 6, c, 2), t, s, 3)),
    "block_local": ({"block": 4, "memory": 3}, lambda t, s, c: block_local_mask(t, s, 4, 3, c)),
}


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("t", "s"), [(19, 19), (13, 24)])  # 24 - 13: no multiple of 2 or 3
@pytest.mark.parametrize("name", sorted(CASES))
def test_equals_dense_attention_under_its_mask(name, t, s, causal):
    kwargs, mask = CASES[name]
    kernel = ATTENTION.get(name)(DIMS, **kwargs)
    q, k, v = qkv(t, s)
    allowed = mask(t, s, causal)
    if causal:
        allowed = allowed & causal_mask(t, s)
    torch.testing.assert_close(kernel(q, k, v, causal=causal),
                               masked_softmax_attention(q, k, v, allowed), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", sorted(CASES) + ["bigbird"])
def test_bias_padding_and_gradients_match_dense_attention(name, causal):
    """An additive bias (the lazy PairBias, evaluated on computed pairs) and key padding --
    one sequence fully padded but its last key -- with the gradients of q, k, v and bias."""
    t = 21
    if name == "bigbird":
        kernel = ATTENTION.get(name)(DIMS, block=3, window_blocks=3, global_blocks=1,
                                     random_blocks=2)
        allowed = bigbird_mask(kernel, t, causal, layer=0)
    else:
        kwargs, mask = CASES[name]
        kernel = ATTENTION.get(name)(DIMS, **kwargs)
        allowed = mask(t, t, causal)
    if causal:
        allowed = allowed & causal_mask(t, t)
    q, k, v = (x.requires_grad_() for x in qkv(t, t, seed=1))
    table = torch.randn(4, t, t, requires_grad=True)  # (H, T, S)
    padding = torch.zeros(2, t, dtype=torch.bool)
    padding[0, 2:9] = True
    padding[1, :-1] = True
    allowed = allowed & ~padding[:, None, None, :]  # (B, 1, T, S)
    out = kernel(q, k, v, causal=causal, bias=PairBias.of_tensor(table), key_padding_mask=padding)
    expected = masked_softmax_attention(q, k, v, allowed, bias=table)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    upstream = torch.randn_like(out)
    grads = torch.autograd.grad((out * upstream).sum(), (q, k, v, table))
    expected_grads = torch.autograd.grad((expected * upstream).sum(), (q, k, v, table))
    for got, want in zip(grads, expected_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("causal", [True, False])
def test_local_with_a_window_of_at_least_t_is_full_attention(causal):
    q, k, v = qkv(23, 23, seed=2)
    full = ATTENTION.get("full")(DIMS)(q, k, v, causal=causal)
    for window in (46, 100):
        local = ATTENTION.get("local")(DIMS, window=window)
        torch.testing.assert_close(local(q, k, v, causal=causal), full, atol=1e-5, rtol=1e-5)


def bigbird_mask(kernel, t, causal, layer):
    """(T, T): window blocks, global blocks (attended by all, attending all) and the random
    blocks the kernel draws for this layer."""
    b = kernel.block
    block_of = torch.arange(t) // b
    query_block, key_block = block_of[:, None], block_of[None, :]
    before, after = (kernel.window_blocks - 1, 0) if causal else (kernel.window_blocks // 2,) * 2
    window = (key_block >= query_block - before) & (key_block <= query_block + after)
    random = kernel.random_key_blocks(math.ceil(t / b), causal, layer)  # (nb, r)
    drawn = (random[block_of][:, :, None] == key_block[:, None, :]).any(1)  # (T, T)
    is_global = (key_block < kernel.global_blocks) | (query_block < kernel.global_blocks)
    return window | drawn | is_global


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("t", [40, 37])
def test_bigbird_equals_dense_attention_under_its_block_pattern(t, causal):
    kernel = ATTENTION.get("bigbird")(DIMS, block=4, window_blocks=3, global_blocks=2,
                                      random_blocks=2)
    q, k, v = qkv(t, t, seed=3)
    for layer in (0, 1):
        allowed = bigbird_mask(kernel, t, causal, layer)
        if causal:
            allowed = allowed & causal_mask(t, t)
        torch.testing.assert_close(kernel(q, k, v, causal=causal, layer=layer),
                                   masked_softmax_attention(q, k, v, allowed), atol=1e-5,
                                   rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_bigbird_random_blocks_avoid_the_window_and_global_blocks_and_respect_causality(causal):
    kernel = ATTENTION.get("bigbird")(DIMS, block=4, window_blocks=3, global_blocks=2,
                                      random_blocks=3)
    nb = 20
    random = kernel.random_key_blocks(nb, causal, layer=0)  # (nb, 3)
    for n in range(nb):
        window = set(range(n - 2, n + 1) if causal else range(n - 1, n + 2))
        drawn = [x for x in random[n].tolist() if x >= 0]
        assert len(drawn) == len(set(drawn)), "distinct blocks"
        assert not set(drawn) & (window | {0, 1}), "outside the window and the global blocks"
        if causal:  # drawn among the earlier blocks; all of them when fewer than 3
            assert all(x < n - 2 for x in drawn)
            assert len(drawn) == min(3, max(0, n - 2 - 2))
        else:
            assert len(drawn) == 3


def test_bigbird_random_blocks_are_fixed_per_layer_and_ignore_the_global_random_state():
    kernel = ATTENTION.get("bigbird")(DIMS, block=4, random_blocks=3)
    torch.manual_seed(0)
    first = kernel.random_key_blocks(32, False, layer=3)
    torch.manual_seed(123)
    torch.rand(10)
    assert torch.equal(kernel.random_key_blocks(32, False, layer=3), first)
    assert not torch.equal(kernel.random_key_blocks(32, False, layer=4), first)
    other_seed = ATTENTION.get("bigbird")(DIMS, block=4, random_blocks=3, seed=1)
    assert not torch.equal(other_seed.random_key_blocks(32, False, layer=3), first)


def test_global_tokens_are_the_first_positions_and_see_everything():
    """Longformer: key 0 moves every output (its global column), and query 0's output, in
    bidirectional mode, moves with the last key (its global row), well outside the window."""
    kernel = ATTENTION.get("longformer")(DIMS, window=4, n_global=1)
    q, k, v = qkv(30, 30, seed=4)
    changed = v.clone()
    changed[:, :, 0] += 1.0
    moved = (kernel(q, k, changed, causal=True) - kernel(q, k, v, causal=True)).abs()
    moved = moved.amax((0, 1, 3))  # (T,)
    assert (moved > 1e-4).all()
    changed = v.clone()
    changed[:, :, -1] += 1.0
    moved = (kernel(q, k, changed, causal=False) - kernel(q, k, v, causal=False)).abs()
    moved = moved.amax((0, 1, 3))
    assert moved[0] > 1e-4 and (moved[1:-3] < 1e-6).all()


def test_a_layout_first_built_in_inference_mode_still_trains():
    """Lightning validates under torch.inference_mode before it trains: the cached block layout
    must not be made of inference tensors."""
    kernel = ATTENTION.get("local")(DIMS, window=3)
    q, k, v = qkv(29, 29, seed=5)  # a shape no other test builds first
    with torch.inference_mode():
        kernel(q, k, v, causal=True)
    q.requires_grad_()
    kernel(q, k, v, causal=True).sum().backward()
    assert torch.isfinite(q.grad).all()
