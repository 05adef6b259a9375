"""Reformer's LSH attention against dense references built here: one bucket and one round is
shared-QK full attention with the self mask; one bucket with chunks is a band; many buckets and
rounds equal dense per-round attention under the masks the layer's own buckets give, combined
by log-sum-exp weights.  Causal at every position; rotations fresh in training, fixed in eval."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from references import band_mask, causal_mask, masked_softmax_attention, query_key_positions
from xformer_bench.attention.lsh import LSHAttention, bucket_factors, hash_buckets
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import POSITION

DIMS = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=64, vocab_size=256)


def layer(**kwargs) -> LSHAttention:
    torch.manual_seed(0)
    return LSHAttention(DIMS, **kwargs).eval()


def heads(y: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, Dh)
    return y.view(y.shape[0], y.shape[1], DIMS.n_heads, DIMS.head_dim).transpose(1, 2)


def dense_rounds(lsh, x, allowed, position=None):
    """Dense shared-QK attention per round under ``allowed`` ((B|1, H|1, R, T, T) or (T, T)):
    each round the shared reference with the unit keys, unscaled, self-logit -1e5 as a bias;
    rounds combined by the softmax of their log-normalisers, then ``out``."""
    qk, v = heads(lsh.qk(x)), heads(lsh.v(x))
    if position is not None:
        qk, _ = position.rotate(qk, qk)
    keys, t = F.normalize(qk, dim=-1), x.shape[1]
    self_logit = -1e5 * torch.eye(t)  # (T, T)
    rounds = allowed.shape[-3] if allowed.dim() > 2 else 1
    per_round = lambda y: y[:, :, None].expand(-1, -1, rounds, -1, -1)  # noqa: E731
    out = masked_softmax_attention(per_round(qk), per_round(keys), per_round(v), allowed,
                                   bias=self_logit, scale=1.0)  # (B, H, R, T, Dh)
    scores = (qk @ keys.transpose(-1, -2) + self_logit)[:, :, None]  # (B, H, 1, T, T)
    scores = scores.masked_fill(~allowed, float("-inf"))
    share = scores.logsumexp(-1).softmax(dim=2)[..., None]  # (B, H, R, T, 1)
    y = (share * out).sum(2)  # (B, H, T, Dh)
    return lsh.out(y.transpose(1, 2).reshape(x.shape))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("position", ["none", "rotary"])
def test_one_bucket_one_round_is_shared_qk_full_attention_with_the_self_mask(causal, position):
    lsh = layer(n_buckets=1, n_hashes=1)  # chunk 64 >= T: one chunk
    pos = POSITION.get(position)(DIMS) if position == "rotary" else Position()
    x = torch.randn(2, 20, 32)
    allowed = causal_mask(20, 20) if causal else torch.ones(20, 20, dtype=torch.bool)
    expected = dense_rounds(lsh, x, allowed, pos if position == "rotary" else None)
    out = lsh(x, ForwardContext(pos, causal=causal))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_the_first_causal_query_attends_to_itself():
    lsh = layer(n_buckets=1, n_hashes=1)
    x = torch.randn(1, 5, 32)
    out = lsh(x, ForwardContext(Position(), causal=True))
    torch.testing.assert_close(out[:, 0], lsh.out(lsh.v(x[:, 0])))  # nothing else to see


@pytest.mark.parametrize("causal", [True, False])
def test_one_bucket_with_chunks_is_a_band_of_chunks(causal):
    """Causal: the previous 4 positions, self included; bidirectional: the own and the
    previous chunk of 4 (no wrap-around); 19 positions, the last chunk partial."""
    lsh = layer(n_buckets=1, n_hashes=1, chunk_size=4)
    x = torch.randn(2, 19, 32)
    i, j = query_key_positions(19, 19)
    allowed = band_mask(19, 19, 3) if causal else (i // 4 - j // 4 >= 0) & (i // 4 - j // 4 <= 1)
    out = lsh(x, ForwardContext(Position(), causal=causal))
    torch.testing.assert_close(out, dense_rounds(lsh, x, allowed), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_buckets_and_rounds_equal_dense_attention_under_the_buckets_masks(causal):
    lsh = layer(chunk_size=4, n_hashes=3)  # 2T/4 = 12 buckets
    x = torch.randn(2, 24, 32)
    padding = torch.zeros(2, 24, dtype=torch.bool)
    padding[1, 5:9] = True
    buckets, n_buckets = lsh.hash(heads(lsh.qk(x)), layer=1)  # (B, H, R, T)
    assert n_buckets == 12 and 0 <= buckets.min() and buckets.max() < 12
    buckets = buckets.masked_fill(padding[:, None, None, :], n_buckets)  # padding sorts last
    t = torch.arange(24)
    rank = (buckets * 24 + t).argsort(-1).argsort(-1)  # sorted index of every position
    same = buckets[..., :, None] == buckets[..., None, :]  # (B, H, R, T, T)
    ri, rj = rank[..., :, None], rank[..., None, :]
    if causal:  # own bucket's last 4 positions up to itself
        allowed = same & (t[None, :] <= t[:, None]) & (ri - rj < 4)
    else:  # the own and the previous chunk of the sorted order, across buckets
        allowed = (ri // 4 - rj // 4 >= 0) & (ri // 4 - rj // 4 <= 1)
    allowed = allowed & ~padding[:, None, None, None, :]
    ctx = ForwardContext(Position(), causal=causal, layer=1, key_padding_mask=padding)
    out, expected = lsh(x, ctx), dense_rounds(lsh, x, allowed)
    # a padded query may have no key at all (the reference's NaN; the layer gives 0)
    torch.testing.assert_close(out[~padding], expected[~padding], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("training", [False, True])
def test_no_position_sees_a_later_token(training):
    lsh = layer(chunk_size=4, n_hashes=2).train(training)
    ctx = ForwardContext(Position(), causal=True)
    x = torch.randn(2, 32, 32)
    torch.manual_seed(1)
    before = lsh(x, ctx).detach()
    for t in range(31):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn(2, 31 - t, 32)
        torch.manual_seed(1)  # the same rotations in training
        after = lsh(changed, ctx).detach()
        torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], atol=1e-6, rtol=1e-6)
        assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])


def test_rotations_are_fresh_in_training_and_fixed_in_evaluation():
    lsh = layer(chunk_size=4)
    qk = torch.randn(1, 2, 64, 16)
    assert torch.equal(lsh.hash(qk, layer=1)[0], lsh.hash(qk, layer=1)[0])
    assert not torch.equal(lsh.hash(qk, layer=1)[0], lsh.hash(qk, layer=2)[0])
    lsh.train()
    torch.manual_seed(3)
    first = lsh.hash(qk)[0]
    assert not torch.equal(first, lsh.hash(qk)[0])
    torch.manual_seed(3)
    assert torch.equal(first, lsh.hash(qk)[0])  # reproducible from torch's seed


def test_evaluation_may_use_more_rounds():
    lsh = layer(chunk_size=4, n_hashes=2, eval_n_hashes=8)
    qk = torch.randn(1, 2, 16, 16)
    assert lsh.hash(qk)[0].shape[2] == 8 and lsh.train().hash(qk)[0].shape[2] == 2


def test_many_buckets_are_hashed_as_two_factors():
    """Above 64 buckets (Reformer §2): two even factors near sqrt(b), trax's for powers of two,
    the product b where such a pair exists, else the nearest (2 x 65 has no even pair)."""
    assert bucket_factors(64) == [64] and bucket_factors(256) == [16, 16]
    assert bucket_factors(192) == [16, 12] and bucket_factors(128) == [16, 8]
    assert bucket_factors(80) == [10, 8] and bucket_factors(130) == [16, 8]
    buckets, n_buckets = layer().hash(torch.randn(1, 2, 4096, 16))  # 2T / 64 = 16 x 8
    assert n_buckets == 128 and buckets.max() < 128 and buckets.unique().numel() > 64
    vectors = torch.randn(1, 1, 500, 8)
    rotations = torch.randn(1, 1, 8, 14)  # (16 + 12) / 2
    buckets = hash_buckets(vectors, rotations, [16, 12])
    assert buckets.min() >= 0 and buckets.max() < 192 and buckets.unique().numel() > 50
    # the hash of a direction: scaling a vector keeps its bucket
    assert torch.equal(hash_buckets(3 * vectors, rotations, [16, 12]), buckets)


def test_the_chunk_size_and_bucket_count_are_checked():
    with pytest.raises(ValueError, match="n_buckets=3"):
        LSHAttention(DIMS, n_buckets=3)
    with pytest.raises(ValueError, match="positive"):
        LSHAttention(DIMS, chunk_size=0)


def test_chunks_attended_in_pieces_give_the_same_result_and_gradients(monkeypatch):
    from xformer_bench.attention import lsh as lsh_module

    lsh = layer(chunk_size=4, n_hashes=2).train()
    x = torch.randn(2, 30, 32, requires_grad=True)
    results = []
    for piece in (2 ** 21, 1, 3 * 2 * 2 * 2 * 2 * 4 * 4):  # all at once, 1 chunk, 3 chunks
        monkeypatch.setattr(lsh_module, "PIECE", piece)
        torch.manual_seed(5)
        out = lsh(x, ForwardContext(Position(), causal=True))
        (grad,) = torch.autograd.grad(out.square().sum(), x)
        results.append((out.detach(), grad))
    for out, grad in results[1:]:
        torch.testing.assert_close(out, results[0][0])
        torch.testing.assert_close(grad, results[0][1])
