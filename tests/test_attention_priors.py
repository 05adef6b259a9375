"""Attention with priors and multi-head refinements: synthesizer, gaussian_prior,
talking_heads, adaptive_span -- each against an explicit reference built here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from references import masked_softmax_attention, query_key_positions
from test_attention_zoo import LargestAllocation, largest_allocation
from xformer_bench.attention._ops.logits import band_attention, plus_distance_term
from xformer_bench.attention.adaptive_span import AdaptiveSpanAttention
from xformer_bench.attention.full import FullAttention
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import PairBias, Position
from xformer_bench.registry import ATTENTION


def dims(seq_len=16, d_model=32, n_heads=4):
    return ModelDims(d_model=d_model, n_heads=n_heads, n_layers=2, d_ff=64, seq_len=seq_len,
                     vocab_size=256)


def qkv(b=2, h=4, t=12, s=12, dh=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, h, t, dh, generator=g), torch.randn(b, h, s, dh, generator=g),
            torch.randn(b, h, s, dh, generator=g))


def reference(q, k, v, causal, extra=None, allowed=None, padding=None):
    return masked_softmax_attention(q, k, v, allowed, causal=causal, bias=extra, padding=padding)


def distances(t, s):  # (T, S): j - i, the queries the last t of s positions
    i, j = query_key_positions(t, s)
    return j - i


# --------------------------------------------------------------------------- talking heads

@pytest.mark.parametrize("causal", [True, False])
def test_talking_heads_with_identity_maps_is_full_attention(causal):
    q, k, v = qkv(t=9, s=13)
    bias = PairBias.of_tensor(torch.randn(4, 9, 13))
    padding = torch.zeros(2, 13, dtype=torch.bool)
    padding[1, :4] = True
    kernel = ATTENTION.get("talking_heads")(dims())
    with torch.no_grad():
        kernel.logits_map.copy_(torch.eye(4))
        kernel.weights_map.copy_(torch.eye(4))
    full = FullAttention(dims())
    for extra in ({}, {"bias": bias, "key_padding_mask": padding}):
        torch.testing.assert_close(kernel(q, k, v, causal=causal, **extra),
                                   full(q, k, v, causal=causal, **extra), atol=1e-5, rtol=1e-5)


def test_talking_heads_mix_the_logits_before_and_the_weights_after_the_softmax():
    q, k, v = qkv(t=10, s=10, seed=1)
    bias = torch.randn(4, 10, 10)
    kernel = ATTENTION.get("talking_heads")(dims())
    p_l, p_w = kernel.logits_map.detach(), kernel.weights_map.detach()
    logits = torch.einsum("bkts,kh->bhts", q @ k.transpose(-1, -2) / math.sqrt(8), p_l) + bias
    logits = logits.masked_fill(~torch.ones(10, 10, dtype=torch.bool).tril(), float("-inf"))
    weights = torch.einsum("bhts,hv->bvts", logits.softmax(-1), p_w)
    out = kernel(q, k, v, causal=True, bias=PairBias.of_tensor(bias))
    torch.testing.assert_close(out, weights @ v, atol=1e-5, rtol=1e-5)


def test_talking_heads_start_from_the_authors_variance_scaling_not_the_identity():
    torch.manual_seed(0)
    kernel = ATTENTION.get("talking_heads")(dims(d_model=64, n_heads=32))
    for p in (kernel.logits_map, kernel.weights_map):
        assert p.shape == (32, 32)
        assert abs(p.std().item() - 32 ** -0.5) < 0.02  # N(0, 1 / fan-in)
        assert not torch.allclose(p, torch.eye(32), atol=0.1)


# --------------------------------------------------------------------------- gaussian prior

def gaussian(sigma, t, s):  # (H, T, S): -(j - i)^2 / (2 sigma_h^2), built explicitly
    return -distances(t, s).float().square()[None] / (2 * sigma[:, None, None] ** 2)


@pytest.mark.parametrize("causal", [True, False])
def test_gaussian_prior_is_dense_attention_plus_the_explicit_prior(causal):
    q, k, v = qkv(t=11, s=14, seed=2)
    kernel = ATTENTION.get("gaussian_prior")(dims())
    sigma = torch.tensor([0.7, 2.0, 5.0, 40.0])
    with torch.no_grad():
        kernel.log_sigma.copy_(sigma.log())
    prior = gaussian(sigma, 11, 14)
    torch.testing.assert_close(kernel(q, k, v, causal=causal),
                               reference(q, k, v, causal, prior), atol=1e-5, rtol=1e-5)
    bias, padding = torch.randn(4, 11, 14), torch.zeros(2, 14, dtype=torch.bool)
    padding[0, 2:6] = True
    out = kernel(q, k, v, causal=causal, bias=PairBias.of_tensor(bias), key_padding_mask=padding)
    torch.testing.assert_close(out, reference(q, k, v, causal, prior + bias, padding=padding),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_a_windowed_gaussian_prior_is_the_prior_under_the_band_mask(causal):
    t, s, window = 37, 41, 9
    q, k, v = qkv(t=t, s=s, seed=3)
    kernel = ATTENTION.get("gaussian_prior")(dims(), init_sigma=3.0, window=window)
    assert kernel.sub_quadratic
    step = distances(t, s)
    band = (step <= 0) & (step > -window) if causal else step.abs() <= window // 2
    bias = torch.randn(4, t, s)
    expected = reference(q, k, v, causal, gaussian(torch.full((4,), 3.0), t, s) + bias, band)
    out = kernel(q, k, v, causal=causal, bias=PairBias.of_tensor(bias))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_the_prior_width_is_learned_per_head():
    q, k, v = qkv(seed=4)
    kernel = ATTENTION.get("gaussian_prior")(dims(), window=5)
    kernel(q, k, v, causal=True).square().sum().backward()
    assert kernel.log_sigma.grad.shape == (4,) and (kernel.log_sigma.grad != 0).all()


@pytest.mark.parametrize("causal", [True, False])
def test_a_window_covering_every_key_is_the_dense_prior(causal):
    """A window reaching every key takes the dense path (a band would gather more keys than
    there are): the output of no window at all, bit for bit; one step narrower, the band."""
    t = s = 13
    q, k, v = qkv(t=t, s=s, seed=8)
    dense = ATTENTION.get("gaussian_prior")(dims(), init_sigma=3.0)
    covering = 2 * s - 1 if not causal else s  # half each side bidirectional
    wide = ATTENTION.get("gaussian_prior")(dims(), init_sigma=3.0, window=covering)
    assert torch.equal(wide(q, k, v, causal=causal), dense(q, k, v, causal=causal))
    narrower = ATTENTION.get("gaussian_prior")(dims(), init_sigma=3.0, window=covering - 2)
    step = distances(t, s)
    band = (step > -(covering - 2)) if causal else step.abs() <= (covering - 2) // 2
    expected = reference(q, k, v, causal, gaussian(torch.full((4,), 3.0), t, s), band)
    torch.testing.assert_close(narrower(q, k, v, causal=causal), expected, atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------- synthesizer

def synthetic_reference(layer, x, causal):
    """The synthesizer recomputed from its parameters: softmax(B) G(X), then ``out``."""
    b, t, d = x.shape
    h, l = layer.n_heads, layer.length
    split = lambda y: y.view(b, t, h, -1).transpose(1, 2)  # noqa: E731
    if layer.mode == "random":
        logits = layer.random[:, :t, :t].expand(b, h, t, t)
    elif layer.mode == "factorized_random":
        logits = torch.einsum("hik,hjk->hij", layer.random_1, layer.random_2)[:, :t, :t]
    else:
        hidden = split(F.relu(x @ layer.hidden.weight.T + layer.hidden.bias))  # (B, H, T, Dh)
        if layer.mode == "dense":
            logits = hidden @ layer.logits.weight.T + layer.logits.bias  # (B, H, T, l)
        else:
            a, c = layer.factor_a(hidden), layer.factor_b(hidden)
            logits = torch.stack([torch.outer(a[i, j, r], c[i, j, r]).flatten()
                                  for i in range(b) for j in range(h) for r in range(t)])
            logits = logits.view(b, h, t, l)
        logits = logits[..., :t]
    if layer.mix:
        q, k = (split(y) for y in layer.qk(x).chunk(2, -1))
        alpha = torch.sigmoid(layer.mix_logit)
        logits = alpha * logits + (1 - alpha) * q @ k.transpose(-1, -2) / math.sqrt(d // h)
    if causal:
        logits = logits.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
    y = logits.softmax(-1) @ split(layer.v(x))
    return layer.out(y.transpose(1, 2).reshape(b, t, d))


SYNTHESIZERS = [{"mode": m} for m in ("dense", "random", "factorized_dense", "factorized_random")]
SYNTHESIZERS += [{"mode": "random", "mix_with_dot_product": True},
                 {"mode": "dense", "mix_with_dot_product": True}]


@pytest.mark.parametrize("options", SYNTHESIZERS, ids=lambda o: "+".join(map(str, o.values())))
def test_synthesizer_matches_its_equations_and_is_causal(options):
    torch.manual_seed(5)
    layer = build_token_mixer({"name": "synthesizer", **options}, dims(seq_len=12))
    x = torch.randn(2, 12, 32)  # (B, T, D)
    for causal in (True, False):
        ctx = ForwardContext(Position(), causal=causal)
        out = layer(x, ctx)
        assert out.shape == (2, 12, 32)
        torch.testing.assert_close(out, synthetic_reference(layer, x, causal), atol=1e-5, rtol=1e-5)
    changed = x.clone()
    changed[:, 7:] = torch.randn(2, 5, 32)
    ctx = ForwardContext(Position(), causal=True)
    torch.testing.assert_close(layer(changed, ctx)[:, :7], layer(x, ctx)[:, :7])
    assert not torch.allclose(layer(changed, ctx)[:, 7:], layer(x, ctx)[:, 7:])
    shorter = layer(x[:, :5], ctx)  # the first 5 rows and columns of B
    torch.testing.assert_close(shorter, synthetic_reference(layer, x[:, :5], True),
                               atol=1e-5, rtol=1e-5)


def test_synthesizer_shapes_and_declarations():
    d = dims(seq_len=12)
    random = build_token_mixer({"name": "synthesizer", "mode": "random"}, d)
    assert random.random.shape == (4, 12, 12)  # one l x l matrix per head
    assert "queries_and_keys" not in random.provides and "additive_bias" not in random.provides
    dense = build_token_mixer({"name": "synthesizer"}, d)
    assert dense.logits.weight.shape == (12, 8)  # W_2: Dh -> l
    factorized = build_token_mixer({"name": "synthesizer", "mode": "factorized_dense"}, d)
    assert (factorized.factor_a.out_features, factorized.factor_b.out_features) == (3, 4)
    mixed = build_token_mixer({"name": "synthesizer", "mix_with_dot_product": True}, d)
    assert {"queries_and_keys", "additive_bias"} <= mixed.provides
    with pytest.raises(ValueError, match="built for data.seq_len=12 positions and got 13"):
        dense(torch.randn(1, 13, 32), ForwardContext(Position()))


# --------------------------------------------------------------------------- adaptive span

def span_layer(seq_len=16, **options) -> tuple[AdaptiveSpanAttention, MultiHeadAttention]:
    torch.manual_seed(6)
    layer = AdaptiveSpanAttention(dims(seq_len), **options)
    full = MultiHeadAttention(dims(seq_len), FullAttention(dims(seq_len)))
    full.load_state_dict(layer.state_dict(), strict=False)  # the same qkv and out
    return layer, full


@pytest.mark.parametrize("causal", [True, False])
def test_adaptive_spans_covering_the_sequence_are_full_attention(causal):
    layer, full = span_layer(max_span=64, ramp=32, init_span=40.0)  # z = 40 >= T
    x = torch.randn(2, 16, 32)
    ctx = ForwardContext(Position(), causal=causal)
    torch.testing.assert_close(layer.eval()(x, ctx), full(x, ctx), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_the_soft_span_mask_renormalises_the_weights_as_the_paper(causal):
    t, ramp = 40, 4
    layer, _ = span_layer(max_span=32, ramp=ramp)
    spans = torch.tensor([0.0, 2.5, 9.0, 20.0])
    with torch.no_grad():
        layer.kernel.span_fraction.copy_(spans / 32)
    assert layer.kernel.reach() == 24  # ceil(20) + R
    q, k, v = qkv(t=t, s=t, seed=7)
    x = -distances(t, t)  # (T, T): i - j
    mask = ((ramp + spans[:, None, None] - x.abs()) / ramp).clamp(0, 1)  # (H, T, T)
    scores = q @ k.transpose(-1, -2) / math.sqrt(8)
    if causal:
        scores = scores.masked_fill(x < 0, float("-inf"))
    weights = scores.softmax(-1) * mask
    weights = weights / weights.sum(-1, keepdim=True)  # a = m e^s / sum m e^s
    torch.testing.assert_close(layer.kernel(q, k, v, causal=causal), weights @ v,
                               atol=1e-5, rtol=1e-5)


def test_the_span_penalty_is_lambda_times_the_mean_span_in_training_only():
    layer, _ = span_layer(max_span=100, span_penalty=2e-6)
    with torch.no_grad():
        layer.kernel.span_fraction.copy_(torch.tensor([0.1, 0.5, 1.3, -0.2]))
    x = torch.randn(1, 16, 32)
    ctx = ForwardContext(Position())
    layer.eval()(x, ctx)
    assert ctx.aux_losses == []
    layer.train()(x, ctx)  # projects the fractions to [0, 1] first (the authors' clamp_param)
    assert layer.kernel.span_fraction.tolist() == pytest.approx([0.1, 0.5, 1.0, 0.0])
    expected = 2e-6 / 4 * (10 + 50 + 100 + 0)  # lambda / M sum_h z_h
    assert ctx.auxiliary_loss().item() == pytest.approx(expected)
    assert layer.mean_span() == pytest.approx(40.0)
    ctx.auxiliary_loss().backward()
    assert layer.kernel.span_fraction.grad.tolist() == pytest.approx([2e-6 / 4 * 100] * 4)


def test_the_cost_follows_the_learned_spans():
    """The default spans (z = 0: the ramp alone) gather 32 keys per query; the loss reaches the
    spans through the soft mask."""
    layer = build_token_mixer({"name": "adaptive_span"}, dims(seq_len=512, d_model=64, n_heads=2))
    assert layer.sub_quadratic and layer.kernel.reach() == 32
    x = torch.randn(1, 512, 64)
    short = largest_allocation(layer, x, ForwardContext(Position())).largest
    with torch.no_grad():
        layer.kernel.span_fraction.fill_(200 / 8192)
    assert layer.kernel.reach() == 232
    longer = largest_allocation(layer, x, ForwardContext(Position())).largest
    assert 3 * short < longer < 512 * 512 * 2
    grad = layer.kernel.span_fraction.grad  # the soft mask carries the loss to the spans
    assert grad is not None and grad.abs().sum() > 0


def span_reference(kernel, q, k, v, causal, bias, padding):
    """The soft span mask written out: softmax(s + b + log m) over the pairs m > 0."""
    x = distances(q.shape[-2], k.shape[-2]).abs()  # (T, S): |i - j|
    m = ((kernel.ramp + kernel.spans().detach()[:, None, None] - x) / kernel.ramp).clamp(0, 1)
    return masked_softmax_attention(q, k, v, m > 0, causal=causal, bias=bias + m.log(),
                                    padding=padding)  # m (H, T, S)


@pytest.mark.parametrize("causal", [True, False])
def test_a_reach_covering_every_key_takes_the_dense_path_with_the_same_output(causal):
    """Across the switch (reach n - 1: the band; n and beyond: full attention with log m as a
    bias) the output is the paper's, and at reach n the band -- no longer taken -- agrees."""
    t, s, ramp = 11, 17, 4
    layer, _ = span_layer(max_span=64, ramp=ramp)
    kernel = layer.kernel
    q, k, v = qkv(t=t, s=s, seed=9)
    bias = torch.randn(4, t, s)
    padding = torch.zeros(2, s, dtype=torch.bool)
    padding[1, :8] = True  # sequence 1's first causal queries see only padding: 0
    for reach in (s - 1, s, s + 3):
        with torch.no_grad():
            kernel.span_fraction.copy_(torch.tensor([0.0, 3.5, 9.0, reach - ramp]) / 64)
        assert kernel.reach() == reach
        out = kernel(q, k, v, causal=causal, bias=PairBias.of_tensor(bias),
                     key_padding_mask=padding)
        expected = span_reference(kernel, q, k, v, causal, bias, padding)
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
        if reach == s:
            masked = plus_distance_term(PairBias.of_tensor(bias), kernel.log_mask, t, s, q.device)
            band = band_attention(q, k, v, before=s - 1, after=s - 1, causal=causal,
                                  bias=masked, key_padding_mask=padding)
            torch.testing.assert_close(out, band, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("causal", [True, False])
def test_a_reach_covering_every_key_allocates_no_more_than_dense_attention(causal):
    """At reach >= n the band would gather reach + a block (twice the reach bidirectional) per
    query: 1.06 n^2 / 2.06 n^2 per head at n = 2048; the dense path holds no tensor larger than
    full attention with a per-head bias does."""
    t = 512
    layer = build_token_mixer({"name": "adaptive_span", "init_span": 8192.0},
                              dims(seq_len=t, d_model=64, n_heads=2))
    assert layer.kernel.reach() >= t
    q, k, v = (torch.randn(1, 2, t, 32, requires_grad=True) for _ in range(3))
    bias = torch.randn(2, t, t, requires_grad=True)  # (H, T, S)
    with LargestAllocation() as spans:
        layer.kernel(q, k, v, causal=causal).sum().backward()
    with LargestAllocation() as full:
        dense = FullAttention(dims(t))(q, k, v, causal=causal, bias=PairBias.of_tensor(bias))
        dense.sum().backward()
    with LargestAllocation() as band:  # what the band would take
        masked = plus_distance_term(None, layer.kernel.log_mask, t, t, q.device)
        band_attention(q, k, v, before=t - 1, after=t - 1, causal=causal,
                       bias=masked).sum().backward()
    assert spans.largest <= full.largest < band.largest, (spans.op, full.op, band.op)
