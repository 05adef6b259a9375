"""Sparse Sinkhorn attention: with the sorting network forced to a hard permutation it equals
dense attention under the explicit mask "own block + the block sorted to it" (built here);
the balancing is doubly stochastic (bidirectional) or causal (strictly lower triangular, row i
independent of later rows); no position sees a later one; padded keys have no influence."""

from __future__ import annotations

import pytest
import torch

from references import masked_softmax_attention
from xformer_bench.attention.sinkhorn import SinkhornAttention, sinkhorn
from xformer_bench.core.dims import ModelDims

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=32, vocab_size=256)


def kernel(**kwargs) -> SinkhornAttention:
    torch.manual_seed(0)
    return SinkhornAttention(DIMS, **kwargs).eval()


def qkv(t: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(2, 2, t, 16, generator=g) for _ in range(3))  # (B, H, T, Dh) each


@pytest.mark.parametrize(("causal", "iters", "target"), [
    (False, 20, [3, 2, 5, 0, 1, 4]),  # a permutation without fixed points
    (True, 20, [None, 0, 1, 2, 3, 4]),  # the one causal permutation: the previous block
    (True, 0, [None, 0, 1, 0, 2, 3]),  # no balancing: a softmax may take a block twice
])
def test_a_hard_sort_is_dense_attention_under_its_block_mask(causal, iters, target, monkeypatch):
    """Blocks of 4 over 22 positions (6 blocks, the last partial); block i takes block
    target[i] (causal: an earlier block, none for block 0) besides its own."""
    attention = kernel(block=4, temperature=0.05, sinkhorn_iters=iters)
    scores = torch.zeros(6, 6)
    for i, j in enumerate(target):
        if j is not None:
            scores[i, j] = 1.0
    monkeypatch.setattr(attention, "sort_logits", lambda pooled: scores.expand(2, 2, 6, 6))
    q, k, v = qkv(22)
    out = attention(q, k, v, causal=causal)
    i, j = torch.arange(22)[:, None], torch.arange(22)[None, :]
    borrowed = torch.tensor([-1 if b is None else b for b in target])[i // 4] == j // 4
    own = (i // 4 == j // 4) & ((j <= i) if causal else True)
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, borrowed | own),
                               atol=1e-5, rtol=1e-5)


def test_bidirectional_balancing_is_doubly_stochastic():
    p = sinkhorn(torch.randn(3, 7, 7), torch.ones(7, 7, dtype=torch.bool), iters=50, causal=False)
    torch.testing.assert_close(p.sum(-1), torch.ones(3, 7))
    torch.testing.assert_close(p.sum(-2), torch.ones(3, 7), atol=1e-4, rtol=0)


def test_causal_balancing_is_lower_triangular_and_blind_to_later_rows():
    allowed = torch.ones(6, 6, dtype=torch.bool).tril(-1)
    scores = torch.randn(6, 6)
    p = sinkhorn(scores, allowed, iters=8, causal=True)
    assert torch.equal(p, p.tril(-1)) and torch.all(p[0] == 0)
    torch.testing.assert_close(p[1:].sum(-1), torch.ones(5))
    for row in range(6):
        changed = scores.clone()
        changed[row + 1:] = torch.randn(5 - row, 6)
        torch.testing.assert_close(sinkhorn(changed, allowed, 8, causal=True)[: row + 1],
                                   p[: row + 1])


@pytest.mark.parametrize("training", [False, True])
def test_no_position_sees_a_later_one(training):
    attention = kernel(block=4).train(training)
    q, k, v = qkv(30)
    torch.manual_seed(1)
    before = attention(q, k, v, causal=True)
    for t in range(29):
        changed = [x.clone() for x in (q, k, v)]
        for x in changed:
            x[:, :, t + 1:] = torch.randn_like(x[:, :, t + 1:])
        torch.manual_seed(1)  # the same Gumbel noise in training
        after = attention(*changed, causal=True)
        assert torch.equal(after[:, :, : t + 1], before[:, :, : t + 1]), t  # bit for bit
        assert not torch.allclose(after[:, :, t + 1:], before[:, :, t + 1:])


def test_causal_pooling_never_rounds_through_a_blocks_later_keys():
    """Block i is pooled from the blocks before it (an exclusive sum) and its own first key:
    changing its later keys, or any later block, leaves blocks 0 .. i bit-identical.  (As
    ``cumsum - total`` the later keys entered and left the sum: 2.4e-7 of dependence.)"""
    attention = kernel(block=4)
    g = torch.Generator().manual_seed(3)
    k_blocks = torch.randn(2, 2, 6, 4, 16, generator=g)  # (B, H, N, b, Dh)
    valid = torch.ones(2, 1, 6, 4, 1, dtype=torch.bool)
    valid[1, :, 2, 2:] = False  # padding inside a block counts alike
    pooled = attention.pool(k_blocks * valid, valid, causal=True)  # (B, H, N, Dh)
    for i in range(6):
        changed = k_blocks.clone()
        changed[:, :, i, 1:] = 1e3 * torch.randn(2, 2, 3, 16, generator=g)
        changed[:, :, i + 1:] = 1e3 * torch.randn_like(changed[:, :, i + 1:])
        again = attention.pool(changed * valid, valid, causal=True)
        assert torch.equal(again[:, :, : i + 1], pooled[:, :, : i + 1]), i
        assert not torch.equal(again[:, :, i + 1:], pooled[:, :, i + 1:]) or i == 5


@pytest.mark.parametrize("causal", [True, False])
def test_padded_keys_have_no_influence(causal):
    attention = kernel(block=4)
    q, k, v = qkv(26, seed=2)
    padding = torch.zeros(2, 26, dtype=torch.bool)
    padding[0, 3:11] = True  # all of block 1, parts of blocks 0 and 2
    padding[1, 20:] = True
    out = attention(q, k, v, causal=causal, key_padding_mask=padding)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, padding[0]] += 5.0  # batch 0's padded keys, changed in both sequences' copies
    v2[:, :, padding[0]] -= 3.0
    changed = attention(q, k2, v2, causal=causal, key_padding_mask=padding)
    torch.testing.assert_close(changed[0], out[0])
    assert torch.isfinite(out).all()


def test_the_sorting_network_learns_and_longer_inputs_are_refused():
    attention = kernel(block=4).train()
    q, k, v = (x.requires_grad_() for x in qkv(32))
    attention(q, k, v, causal=False).square().sum().backward()
    grads = [attention.sort_hidden.grad, attention.sort_scores.grad]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)
    with pytest.raises(ValueError, match="9 blocks of 4.*scores 8"):
        attention(*qkv(33), causal=True)
