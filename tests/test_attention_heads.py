"""Multi-head refinements: persistent memory, multi-query and grouped-query
attention, cross-covariance attention, and the feed-forward option ``none`` -- each against
an explicit reference built here (the attention ones on the shared dense reference,
references.py)."""

from __future__ import annotations

import math

import pytest
import torch

from references import masked_softmax_attention
from xformer_bench.attention.full import FullAttention
from xformer_bench.errors import ConfigError
from xformer_bench.models.block import Block
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.position import PairBias, Position
from xformer_bench.registry import ATTENTION, FFN

DIMS = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=16, vocab_size=256)


def _mixer(spec: dict, seed: int = 0):
    torch.manual_seed(seed)
    return build_token_mixer(spec, DIMS).eval()


def _lm(attention: dict, ffn: dict | None = None, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(DIMS, attention, {"name": "layernorm"}, {"name": "gelu"},
                         {"name": "sinusoidal"}, ffn=ffn or {"name": "dense"})


def _qkv(t: int, s: int, seed: int, b: int = 2, h: int = 4, dh: int = 8):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, dh, generator=g)  # (B, H, T, Dh)
    k, v = torch.randn(2, b, h, s, dh, generator=g).unbind(0)  # (B, H, S, Dh) each
    return q, k, v


# -- grouped-query and multi-query attention ---------------------------------------------------

@pytest.mark.parametrize("causal", [True, False])
def test_grouped_query_with_a_kv_head_per_query_head_equals_full_attention(causal):
    full = _mixer({"name": "full"})
    grouped = _mixer({"name": "grouped_query", "n_kv_heads": DIMS.n_heads}, seed=1)
    grouped.load_state_dict(full.state_dict())  # same shapes: the same weights
    x = torch.randn(2, 9, DIMS.d_model)  # (B, T, D)
    ctx = ForwardContext(Position(), causal=causal)
    torch.testing.assert_close(grouped(x, ctx), full(x, ctx))


def test_grouped_query_equals_full_attention_with_each_groups_kv_weights_repeated():
    """n_kv_heads = 2 of 4 heads: full attention whose key/value heads 0,1 and 2,3 carry the
    weights of shared heads 0 and 1 computes the same function."""
    grouped = _mixer({"name": "grouped_query", "n_kv_heads": 2})
    full = _mixer({"name": "full"}, seed=1)
    d, dh = DIMS.d_model, DIMS.head_dim
    wq, wk, wv = grouped.qkv.weight.split([d, 2 * dh, 2 * dh])  # (rows, D) each
    bq, bk, bv = grouped.qkv.bias.split([d, 2 * dh, 2 * dh])

    def repeat(w):  # (2 Dh, ...) -> (4 Dh, ...): kv head g serves query heads 2g and 2g + 1
        return w.view(2, dh, *w.shape[1:]).repeat_interleave(2, 0).reshape(d, *w.shape[1:])

    with torch.no_grad():
        full.qkv.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        full.qkv.bias.copy_(torch.cat([bq, repeat(bk), repeat(bv)]))
        full.out.load_state_dict(grouped.out.state_dict())
    x = torch.randn(2, 11, d)
    ctx = ForwardContext(Position())
    torch.testing.assert_close(grouped(x, ctx), full(x, ctx), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n_kv_heads", [3, 0, 8])
def test_grouped_query_refuses_a_kv_head_count_that_does_not_divide_the_heads(n_kv_heads):
    with pytest.raises(ConfigError) as refused:
        _mixer({"name": "grouped_query", "n_kv_heads": n_kv_heads})
    assert str(refused.value) == (f"attention.n_kv_heads={n_kv_heads} must divide "
                                  f"model.n_heads={DIMS.n_heads}")


def test_multi_query_saves_the_kv_projections_of_all_heads_but_one():
    full, multi = _mixer({"name": "full"}), _mixer({"name": "multi_query"})
    h, dh, d = DIMS.n_heads, DIMS.head_dim, DIMS.d_model
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    saved = 2 * (h - 1) * dh * d + 2 * (h - 1) * dh  # key and value weights, and biases
    assert count(full) - count(multi) == saved
    assert multi.n_kv_heads == 1
    full_lm, multi_lm = _lm({"name": "full"}), _lm({"name": "multi_query"})
    # what the record's params report
    assert full_lm.num_parameters() - multi_lm.num_parameters() == DIMS.n_layers * saved


# -- persistent memory --------------------------------------------------------------------------

def _persistent_reference(kernel, q, k, v, causal, bias=None, key_padding_mask=None):
    """Softmax over [memory; sequence] keys: the shared reference with the N memory vectors
    prepended as the earliest key positions -- before every query, so the causal mask leaves
    them all visible -- with no bias (zeros) and no padding on them."""
    b, h, t, _ = q.shape
    n = kernel.n_persistent
    memory_k = kernel.keys * math.sqrt(q.shape[-1])  # (H, N, Dh)
    memory_v = kernel.values * math.sqrt(n)  # (H, N, Dh)
    keys = torch.cat([memory_k.expand(b, -1, -1, -1), k], -2)  # (B, H, N + S, Dh)
    values = torch.cat([memory_v.expand(b, -1, -1, -1), v], -2)
    if bias is not None:
        bias = torch.cat([bias.new_zeros(h, t, n), bias], -1)  # (H, T, N + S)
    if key_padding_mask is not None:
        key_padding_mask = torch.cat([key_padding_mask.new_zeros(b, n), key_padding_mask], -1)
    return masked_softmax_attention(q, keys, values, causal=causal, bias=bias,
                                    padding=key_padding_mask)


@pytest.mark.parametrize("causal", [True, False])
def test_persistent_memory_without_vectors_is_full_attention(causal):
    kernel = ATTENTION.build({"name": "persistent_memory", "n_persistent": 0}, dims=DIMS)
    full = FullAttention(DIMS)
    q, k, v = _qkv(6, 10, seed=0)  # 6 queries, the last of 10 keys
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[1, :3] = True
    bias = PairBias.of_tensor(torch.randn(4, 6, 10))  # (H, T, S)
    for kwargs in ({}, {"bias": bias}, {"key_padding_mask": padding}):
        torch.testing.assert_close(kernel(q, k, v, causal=causal, **kwargs),
                                   full(q, k, v, causal=causal, **kwargs))
    full_layer = _mixer({"name": "full"})  # and the whole sublayer, same weights
    persistent = _mixer({"name": "persistent_memory", "n_persistent": 0}, seed=1)
    persistent.load_state_dict(full_layer.state_dict(), strict=False)  # the (empty) memory stays
    x, ctx = torch.randn(2, 7, DIMS.d_model), ForwardContext(Position(), causal=causal)
    torch.testing.assert_close(persistent(x, ctx), full_layer(x, ctx))


@pytest.mark.parametrize("causal", [True, False])
def test_persistent_memory_equals_softmax_over_memory_and_sequence(causal):
    torch.manual_seed(4)
    kernel = ATTENTION.build({"name": "persistent_memory", "n_persistent": 5}, dims=DIMS)
    q, k, v = _qkv(4, 7, seed=1)
    bias = torch.randn(4, 4, 7)  # (H, T, S)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0, 1] = True
    padding[1] = True  # every sequence key of row 1: it still reads the memory
    with torch.no_grad():
        for kwargs in ({}, {"bias": bias, "key_padding_mask": padding}):
            lazy = {**kwargs, "bias": PairBias.of_tensor(bias)} if "bias" in kwargs else kwargs
            out = kernel(q, k, v, causal=causal, **lazy)
            assert torch.isfinite(out).all()
            expected = _persistent_reference(kernel, q, k, v, causal, **kwargs)
            torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_persistent_vectors_are_per_head_at_the_authors_scale_and_survive_the_model_init():
    model = _lm({"name": "persistent_memory", "n_persistent": 512})
    kernel = model.blocks[0].attention.kernel
    assert kernel.keys.shape == kernel.values.shape == (DIMS.n_heads, 512, DIMS.head_dim)
    memory_k, memory_v = kernel.memory()
    assert 0.9 < memory_k.std() < 1.1 and 0.9 < memory_v.std() < 1.1  # unit vectors at use
    assert abs(kernel.keys.std() * math.sqrt(DIMS.head_dim) - 1) < 0.1  # stored N(0, 1/dh)
    assert abs(kernel.values.std() * math.sqrt(512) - 1) < 0.1  # stored N(0, 1/N)


def test_all_attention_network_has_no_feed_forward_and_is_causal():
    """attention=persistent_memory with ffn=none: Sukhbaatar et al.'s all-attention model."""
    n = 8
    model = _lm({"name": "persistent_memory", "n_persistent": n}, {"name": "none"}).eval()
    reference = _lm({"name": "full"}, {"name": "none"})
    assert not list(model.blocks[0].feedforward.parameters())
    memory = DIMS.n_layers * 2 * DIMS.n_heads * n * DIMS.head_dim
    assert model.num_parameters() == reference.num_parameters() + memory
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 6] = (changed[:, 6] + 1) % 256
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :6], model(changed)[:, :6])
    model.train()(tokens).mean().backward()
    assert model.blocks[0].attention.kernel.keys.grad.abs().sum() > 0


# -- cross-covariance attention -----------------------------------------------------------------

def _xca_reference(q, k, v, temperature):
    """El-Nouby et al.'s XCA: softmax attention across channels -- the shared reference with
    channel i of q (unit-norm over the sequence, times the head's temperature) as query i,
    the unit channels of k as the keys and the channels of v as the values, unscaled."""
    qn = q / q.norm(dim=-2, keepdim=True)  # (B, H, T, Dh): unit columns
    kn = k / k.norm(dim=-2, keepdim=True)
    queries = (qn * temperature[:, None, None]).transpose(-1, -2)  # (B, H, Dh, T)
    out = masked_softmax_attention(queries, kn.transpose(-1, -2), v.transpose(-1, -2),
                                   scale=1.0)  # (B, H, Dh, T): [i] = sum_j w_ij v_j (channels)
    return out.transpose(-1, -2)  # (B, H, T, Dh)


def test_xcit_equals_its_explicit_formula_and_ignores_padded_positions():
    kernel = ATTENTION.build({"name": "xcit"}, dims=DIMS)
    with torch.no_grad():
        kernel.temperature.copy_(torch.tensor([0.5, 1.0, 2.0, 4.0]))
    q, k, v = _qkv(9, 9, seed=2)
    with torch.no_grad():
        expected = _xca_reference(q, k, v, kernel.temperature)
        torch.testing.assert_close(kernel(q, k, v, causal=False), expected, atol=1e-5, rtol=1e-5)
        padding = torch.zeros(2, 9, dtype=torch.bool)
        padding[1, 6:] = True  # the last three positions of sequence 1
        out = kernel(q, k, v, causal=False, key_padding_mask=padding)
        alone = _xca_reference(q[1:, :, :6], k[1:, :, :6], v[1:, :, :6], kernel.temperature)
        torch.testing.assert_close(out[1:, :, :6], alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[:1], kernel(q[:1], k[:1], v[:1], causal=False))


def test_xcit_is_bidirectional_linear_and_refused_by_the_decoder_lm():
    mixer = _mixer({"name": "xcit"})
    assert mixer.sub_quadratic and "causal" not in mixer.provides
    assert {"bidirectional", "key_padding_mask", "variable_length"} <= mixer.provides
    assert mixer.kernel.temperature.shape == (DIMS.n_heads,)  # 1-D: no weight decay, as in XCiT
    with pytest.raises(ConfigError, match="attention=xcit does not provide"):
        _lm({"name": "xcit"})
    x = torch.randn(1, 20, DIMS.d_model)
    ctx = ForwardContext(Position(), causal=False)
    changed = x.clone()
    changed[:, -1] += 1.0
    assert not torch.allclose(mixer(x, ctx)[:, 0], mixer(changed, ctx)[:, 0])  # sees the future


# -- ffn=none -----------------------------------------------------------------------------------

def _block(placement: str, ffn: str = "none") -> Block:
    torch.manual_seed(0)
    return Block(build_token_mixer({"name": "full"}, DIMS),
                 FFN.build({"name": ffn}, dims=DIMS, activation={"name": "gelu"}),
                 lambda: torch.nn.LayerNorm(DIMS.d_model), placement=placement)


def test_no_feed_forward_leaves_the_block_its_attention_sublayer():
    x, ctx = torch.randn(2, 5, DIMS.d_model, requires_grad=True), ForwardContext(Position())
    pre = _block("pre")
    attention = x + pre.attention(pre.norms["attention"]["input"](x), ctx)
    torch.testing.assert_close(pre(x, ctx), attention)
    pre(x, ctx).sum().backward()  # the unused branch norm joins the graph with zero gradient
    gain = pre.norms["feedforward"]["input"].weight.grad
    assert gain is not None and not gain.any()
    post = _block("post")  # post-LN: a second norm after the attention sublayer's
    norms = post.norms
    expected = norms["feedforward"]["residual"](
        norms["attention"]["residual"](x + post.attention(x, ctx)))
    torch.testing.assert_close(post(x, ctx), expected)
    assert FFN.build({"name": "none"}, dims=DIMS, activation={"name": "gelu"})(x).eq(0).all()
