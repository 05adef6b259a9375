"""Sparse Transformer factorisations (strided, fixed) and axial attention: in every mode, each
equals dense softmax attention under the paper's pattern written as an explicit (T, S) mask
here -- outputs and gradients, causal and bidirectional as declared, with an additive bias,
key padding, more keys than queries and lengths off the grid (``stride: auto`` too: l ~
sqrt(c S)); only a stride that grows so is declared sub-quadratic; plus their errors."""

from __future__ import annotations

import math

import pytest
import torch

from references import masked_softmax_attention
from xformer_bench.attention._ops.factorized import balanced_width
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION

# (attention, its keyword arguments, the row width l of its grid for S keys)
CASES = [
    ("strided", {"stride": 4}, lambda s: 4),
    ("fixed", {"stride": 5, "summary": 2}, lambda s: 5),
    ("strided", {"stride": "auto"}, balanced_width),
    ("fixed", {"stride": "auto", "summary": 2}, lambda s: balanced_width(s, 2)),
    ("fixed", {"stride": "auto", "summary": 8}, lambda s: balanced_width(s, 8)),  # c capped at l
    ("axial", {"cols": 5}, lambda s: 5),
    ("axial", {"rows": 4}, lambda s: math.ceil(s / 4)),
    ("axial", {}, lambda s: math.ceil(math.sqrt(s))),
]


def patterns(name: str, kwargs: dict, l: int, i: torch.Tensor, j: torch.Tensor):
    """(A1, A2) of the papers, as boolean masks over query positions i and key positions j."""
    if name == "strided":  # Child et al. 2019, §4.3 (A1 with the reference code's l keys),
        # mirrored when bidirectional (dense_mask keeps j <= i when causal)
        return (i - j).abs() < l, (i - j) % l == 0
    if name == "fixed":
        c = min(kwargs["summary"], l)  # stride auto: c at most the row
        return i // l == j // l, j % l >= l - c
    return i // l == j // l, i % l == j % l  # axial: rows, columns


def dense_mask(name, kwargs, mode, causal, layer, heads, t, s):
    """(H, T, S) bool: which keys each head's query may attend to; queries are the last T."""
    l = next(width for n, kw, width in CASES if (n, kw) == (name, kwargs))(s)
    i = torch.arange(s - t, s)[:, None]  # (T, 1) query positions
    j = torch.arange(s)[None, :]  # (1, S)
    a1, a2 = (a.expand(t, s) for a in patterns(name, kwargs, l, i, j))
    if mode == "merged":
        per_head = [a1 | a2] * heads
    elif mode == "interleaved":
        per_head = [a1 if layer % 2 == 0 else a2] * heads
    else:  # multihead: the first ceil(H/2) heads A1
        per_head = [a1 if h < (heads + 1) // 2 else a2 for h in range(heads)]
    mask = torch.stack(per_head)  # (H, T, S)
    return mask & (j <= i) if causal else mask


def kernel(name, kwargs, mode, heads=4, seq_len=21):
    dims = ModelDims(d_model=8 * heads, n_heads=heads, n_layers=2, d_ff=32, seq_len=seq_len,
                     vocab_size=256)
    return ATTENTION.get(name)(dims, mode=mode, **kwargs)


def inputs(heads, t, s, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, t, 8, generator=g)
    k, v = torch.randn(2, 2, heads, s, 8, generator=g).unbind(0)
    bias = torch.randn(heads, t, s, generator=g)
    return q, k, v, bias


def assert_matches_reference(layer_kernel, name, kwargs, mode, causal, layer, q, k, v,
                             bias=None, padding=None):
    heads, t, s = q.shape[1], q.shape[-2], k.shape[-2]
    mask = dense_mask(name, kwargs, mode, causal, layer, heads, t, s)
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    out = layer_kernel(q, k, v, causal=causal, layer=layer, key_padding_mask=padding,
                       bias=None if bias is None else PairBias.of_tensor(bias))
    qr, kr, vr = (x.detach().clone().requires_grad_() for x in (q, k, v))
    expected = masked_softmax_attention(qr, kr, vr, mask, bias=bias, padding=padding)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    cotangent = torch.randn_like(out)
    (out * cotangent).sum().backward()
    (expected * cotangent).sum().backward()
    for mine, theirs in ((q, qr), (k, kr), (v, vr)):
        torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", ["interleaved", "merged", "multihead"])
@pytest.mark.parametrize(("name", "kwargs"), [(n, kw) for n, kw, _ in CASES],
                         ids=[f"{n}-{'-'.join(map(str, kw.items())) or 'sqrt'}"
                              for n, kw, _ in CASES])
def test_equals_dense_attention_under_the_pattern_mask(name, kwargs, mode):
    layer_kernel = kernel(name, kwargs, mode)
    for causal in (True, False):
        if ("causal" if causal else "bidirectional") not in layer_kernel.provides:
            continue
        for t, s, seed in ((21, 21, 0), (20, 20, 1), (9, 22, 2)):  # off the grid; longer keys
            q, k, v, bias = inputs(4, t, s, seed)
            for layer in ((0, 1) if mode == "interleaved" else (0,)):
                assert_matches_reference(layer_kernel, name, kwargs, mode, causal, layer, q, k, v)
                assert_matches_reference(layer_kernel, name, kwargs, mode, causal, layer, q, k, v,
                                         bias=bias)


@pytest.mark.parametrize(("name", "kwargs"), [(n, kw) for n, kw, _ in CASES[:3]])
def test_padding_content_bias_and_an_odd_head_split(name, kwargs):
    """Padded keys (a whole causal row of sequence 1 among them: it gives 0), a bias that
    depends on the batch (B, H, T, S), three heads split 2 + 1 in multihead mode."""
    q, k, v, _ = inputs(3, 14, 17, seed=3)
    bias = torch.randn(2, 3, 14, 17, generator=torch.Generator().manual_seed(4))
    padding = torch.zeros(2, 17, dtype=torch.bool)
    padding[1, :5] = True  # causal queries at positions 3, 4 of sequence 1 see only padding
    padding[0, 9] = True
    for mode in ("merged", "multihead"):
        layer_kernel = kernel(name, kwargs, mode, heads=3)
        for causal in (True, False):
            if ("causal" if causal else "bidirectional") in layer_kernel.provides:
                assert_matches_reference(layer_kernel, name, kwargs, mode, causal, 0, q, k, v,
                                         bias=bias, padding=padding)


def test_merged_counts_the_shared_key_once():
    """The query itself is in both strided patterns: with l = 1 both are {j <= i}, so merged
    must be plain causal attention (a double-counted key would differ)."""
    q, k, v, _ = inputs(2, 6, 6, seed=5)
    out = kernel("strided", {"stride": 1}, "merged", heads=2)(q, k, v, causal=True)
    torch.testing.assert_close(out, masked_softmax_attention(q, k, v, causal=True),
                               atol=1e-5, rtol=1e-5)


def test_bidirectional_strided_is_the_causal_pattern_mirrored():
    """Each query's keys both ways are its causal keys and their reflection through the query:
    the pairs a bidirectional strided layer attends (its output's gradient reaching a key) at
    T = 13, l = 4, written out for query 5: the row band 2..8 and its column 1, 9."""
    layer_kernel = kernel("strided", {"stride": 4}, "merged", heads=1)
    assert {"causal", "bidirectional"} <= layer_kernel.provides
    q, k, v, _ = inputs(1, 13, 13, seed=6)
    k.requires_grad_()
    attended = []
    for i in range(13):
        (grad,) = torch.autograd.grad(layer_kernel(q, k, v, causal=False)[0, 0, i].sum(), k)
        attended.append(grad[0, 0].abs().sum(-1) > 0)
    attended = torch.stack(attended)  # (T, S): key j influenced query i's output
    assert attended[5].nonzero().flatten().tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    i, j = torch.arange(13)[:, None], torch.arange(13)[None]
    causal = ((i - j).abs() < 4) | ((i - j) % 4 == 0)
    assert torch.equal(attended, (causal & (j <= i)) | (causal & (j <= i)).T)


@pytest.mark.parametrize(("name", "kwargs", "message"), [
    ("fixed", {"summary": 9, "stride": 8}, "summary=9 .* between 1 and stride=8"),
    ("strided", {"stride": 0}, "stride=0 must be at least 1"),
    ("fixed", {"stride": "sqrt"}, "stride=sqrt must be at least 1, or auto"),
    ("axial", {"rows": 4, "cols": 4}, "rows x cols = 4 x 4 = 16 does not lay out data.seq_len=21"),
    ("axial", {"mode": "both"}, "mode='both'; choose one of interleaved, merged, multihead"),
])
def test_configuration_errors_are_one_line(name, kwargs, message):
    kwargs = {"mode": "merged", **kwargs}
    mode = kwargs.pop("mode")
    with pytest.raises(ConfigError, match=message):
        kernel(name, kwargs, mode)


def test_multihead_needs_two_heads():
    with pytest.raises(ConfigError, match="needs model.n_heads >= 2"):
        kernel("fixed", {}, "multihead", heads=1)


@pytest.mark.parametrize(("kwargs", "s", "width"), [
    ({"cols": 7}, 30, 7), ({"rows": 4}, 30, 8), ({}, 30, 6), ({}, 36, 6),
    ({"rows": 4, "cols": 5}, 20, 5),
])
def test_axial_layout_follows_rows_or_cols(kwargs, s, width):
    assert kernel("axial", kwargs, "interleaved", seq_len=20).width(s) == width


def test_only_a_stride_that_grows_as_sqrt_t_is_declared_sub_quadratic():
    """At a fixed l, A2 has S c / l keys per query: O(T^2 c / l) (fixed at l = 128, c = 32 sees
    T / 4 keys per query).  ``auto``: G = ceil(sqrt(S / c)) rows of ceil(S / G), l + G c keys
    per query, O(T sqrt(c T))."""
    for name, kwargs in (("fixed", {"stride": 128, "summary": 32}), ("strided", {"stride": 128})):
        assert not kernel(name, kwargs, "merged").sub_quadratic
        assert kernel(name, {**kwargs, "stride": "auto"}, "merged").sub_quadratic
    assert kernel("axial", {}, "interleaved").sub_quadratic  # cols = ceil(sqrt(T))
    fixed = kernel("fixed", {"stride": "auto", "summary": 32}, "merged")
    assert [fixed.width(s) for s in (2048, 4096, 16384)] == [256, 342, 713]  # 8, 12, 23 rows
    strided = kernel("strided", {"stride": "auto"}, "merged")
    assert [strided.width(s) for s in (2048, 4096, 16384)] == [45, 64, 128]
