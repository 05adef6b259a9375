"""The gated linear engine (``attention/_ops/gated_linear.py``) and its three mixers, ``retnet``,
``gla`` and ``mamba2``: the chunked form equals the plain recurrence and the parallel T x T form
(forward and gradients, chunks that do and do not divide T, each decay granularity), stays finite
where a naive exp(-cumulative decay) overflows, decodes step by step as it runs forward, honours
padding, and the mixers are causal, chunk-size invariant and built at their papers' defaults.
On a GPU with ``fla``: xbench's chunked form equals fla's kernels within bf16 tolerance."""

from __future__ import annotations

import importlib.util
import math

import pytest
import torch
import yaml

from xformer_bench.attention._ops.gated_linear import (
    chunked_gated_linear, fla_gated_linear, gated_linear, gated_linear_step)
from xformer_bench.attention.retnet import retention_decays, rotate_pairs
from xformer_bench.config import CONF_DIR
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position

# ------------------------------------------------------------------------- naive references


def recurrence(q, k, v, g, scale, state=None):
    """S_t = exp(g_t) * S_{t-1} + k_t^T v_t, o_t = scale q_t S_t, one position at a time in
    float64; g broadcastable to (B, H, T, 1 or Dk).  Returns (B, H, T, Dv) and the last S."""
    b, h, t, dk = q.shape
    q, k, v, g = (x.double() for x in (q, k, v, g))
    g = g.expand(b, h, t, g.shape[-1])
    s = q.new_zeros(b, h, dk, v.shape[-1]) if state is None else state.double()
    out = []
    for i in range(t):
        s = g[:, :, i, :, None].exp() * s + k[:, :, i, :, None] * v[:, :, i, None, :]
        out.append(scale * torch.einsum("bhd,bhde->bhe", q[:, :, i], s))
    return torch.stack(out, dim=2), s


def parallel(q, k, v, g, scale):
    """The parallel form: o_i = scale sum_{j<=i} (sum_d q_id k_jd exp(L_id - L_jd)) v_j, with
    L the cumulative log-decay over the whole sequence (T x T x Dk, float64)."""
    b, h, t, dk = q.shape
    cum = g.double().expand(b, h, t, g.shape[-1]).cumsum(2)  # (B, H, T, G)
    gap = cum[:, :, :, None, :] - cum[:, :, None, :, :]  # (B, H, T, T, G)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)[..., None]
    weights = torch.einsum("bhid,bhjd,bhijd->bhij", q.double(), k.double(),
                           gap.masked_fill(future, float("-inf")).exp().expand(-1, -1, -1, -1, dk))
    return scale * weights @ v.double()


def inputs(kind: str, b=2, h=3, t=21, dk=4, dv=5, seed=0, strength=1.0):
    """q, k, v and log-decays of one granularity: fixed per head (1, H, 1, 1), per head and
    position (B, H, T, 1), per key dimension (B, H, T, Dk)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, b, h, t, dk, generator=gen).unbind(0)
    v = torch.randn(b, h, t, dv, generator=gen)
    shape = {"fixed": (1, h, 1, 1), "scalar": (b, h, t, 1), "vector": (b, h, t, dk)}[kind]
    g = -strength * torch.rand(shape, generator=gen)  # log-decays in (-strength, 0]
    return q, k, v, g


KINDS = ("fixed", "scalar", "vector")


# ------------------------------------------------------------------------------ the engine


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk", [1, 4, 5, 8, 64])  # 5, 8: not dividing T = 21; 64 > T
def test_chunked_equals_recurrence_and_parallel_forward_and_gradients(kind, chunk):
    q, k, v, g = (x.requires_grad_() for x in inputs(kind))
    state = torch.randn(2, 3, 4, 5)
    out, last = chunked_gated_linear(q, k, v, g, scale=0.5, chunk=chunk, state=state)
    ref, ref_last = recurrence(q, k, v, g, 0.5, state)
    torch.testing.assert_close(out, ref.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, ref_last.float(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(chunked_gated_linear(q, k, v, g, scale=0.5, chunk=chunk)[0],
                               parallel(q, k, v, g, 0.5).float(), atol=1e-5, rtol=1e-5)
    cotangent = torch.randn_like(out)
    grads = torch.autograd.grad((out * cotangent).sum() + last.sum(), (q, k, v, g))
    ref_grads = torch.autograd.grad((ref * cotangent).sum() + ref_last.sum(), (q, k, v, g))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want.float(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["scalar", "vector"])
def test_strong_decays_stay_finite_where_the_naive_factorisation_overflows(kind):
    """Log-decays down to -30 a step: a chunk of 16 reaches about -240, so exp(-b_j) would be
    inf in float32 (and the product inf * 0 = nan); the chunked form stays finite and exact to
    the float32 rounding of cumulative sums near -240 (1e-5 of the exponent)."""
    q, k, v, g = (x.requires_grad_() for x in inputs(kind, t=40, strength=30.0))
    cum = g.detach().expand(2, 3, 40, g.shape[-1])[:, :, :16].sum(2)
    assert torch.isinf(torch.exp(-cum)).any()  # the factorised form would overflow
    out, _ = chunked_gated_linear(q, k, v, g, scale=1.0, chunk=16)
    torch.testing.assert_close(out, recurrence(q, k, v, g, 1.0)[0].float(), atol=1e-4, rtol=1e-4)
    out.square().sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v, g))


@pytest.mark.parametrize("kind", KINDS)
def test_the_step_and_a_prompt_from_a_state_continue_the_forward_pass(kind):
    q, k, v, g = inputs(kind, t=13)
    full, last = chunked_gated_linear(q, k, v, g, scale=0.3, chunk=4)

    def cut(x, a, b):
        return x if x.shape[2] == 1 else x[:, :, a:b]

    head, state = gated_linear(*(cut(x, 0, 6) for x in (q, k, v, g)), scale=0.3, chunk=4,
                               keep_state=True)  # a prompt of 6
    steps = [head]
    for i in range(6, 13):  # then one position at a time
        out, state = gated_linear(*(cut(x, i, i + 1) for x in (q, k, v, g)), scale=0.3,
                                  chunk=4, state=state, keep_state=True)
        steps.append(out)
    torch.testing.assert_close(torch.cat(steps, dim=2), full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(state, last, atol=1e-5, rtol=1e-5)
    step_out, step_state = gated_linear_step(q, k, v, g, None, scale=0.3)  # T steps at once
    torch.testing.assert_close(step_out, full, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(step_state, last, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_a_padded_position_neither_writes_nor_decays_the_state(kind):
    q, k, v, g = inputs(kind, t=12)
    padding = torch.zeros(2, 12, dtype=torch.bool)
    padding[0, 3] = padding[0, 9:] = padding[1, 0] = True
    keep = ~padding[:, None, :].expand(2, 3, 12)  # (B, H, T)
    out, _ = gated_linear(q, k, v, g, scale=1.0, chunk=5, key_padding_mask=padding)
    for row in range(2):  # equals the sequence with its padded positions removed
        kept = keep[row, 0]
        sub = [x[row:row + 1, :, kept] if x.shape[2] > 1 else x for x in (q, k, v, g)]
        want, _ = recurrence(*sub, 1.0)
        torch.testing.assert_close(out[row:row + 1, :, kept], want.float(), atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------ the mixers

SMALL = {"retnet": {"n_heads": 2}, "gla": {"n_heads": 2},
         "mamba2": {"head_dim": 8, "d_state": 6, "n_groups": 2}}
"""Tiny widths (d_model 16): several heads each, so the per-head decays differ (Mamba-2: 4 heads
in 2 groups of B and C)."""


def mixer(name: str, d_model: int = 16, **overrides):
    spec = yaml.safe_load((CONF_DIR / "attention" / f"{name}.yaml").read_text())
    dims = ModelDims(d_model=d_model, n_heads=2, n_layers=2, d_ff=32, seq_len=64, vocab_size=64)
    torch.manual_seed(0)
    return build_token_mixer({**spec, **SMALL[name], **overrides}, dims)


def context(padding=None, cache=None) -> ForwardContext:
    return ForwardContext(Position(), causal=True, key_padding_mask=padding, cache=cache)


NAMES = ("retnet", "gla", "mamba2")


@pytest.mark.parametrize("name", NAMES)
def test_the_mixer_does_not_depend_on_its_chunk_size(name):
    x = torch.randn(2, 23, 16, requires_grad=True)
    outputs, grads = [], []
    for chunk in (1, 4, 7, 64):
        layer = mixer(name, chunk_size=chunk)
        out = layer(x, context())
        outputs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), [x, *layer.parameters()]))
    for out, grad in zip(outputs[1:], grads[1:]):
        torch.testing.assert_close(out, outputs[0], atol=1e-5, rtol=1e-5)
        for got, want in zip(grad, grads[0]):
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_changing_position_t_never_changes_an_earlier_output(name):
    layer = mixer(name, chunk_size=4).eval()
    x = torch.randn(2, 19, 16)
    before = layer(x, context())
    for t in (1, 4, 5, 11, 18):  # chunk edges (4) and inside chunks
        changed = x.clone()
        changed[:, t:] = torch.randn(2, 19 - t, 16)
        after = layer(changed, context())
        torch.testing.assert_close(after[:, :t], before[:, :t], atol=0, rtol=0)
        assert not torch.allclose(after[:, t:], before[:, t:])


@pytest.mark.parametrize("prefix", [1, 6])
@pytest.mark.parametrize("name", NAMES)
def test_recurrent_decoding_equals_the_forward_pass(name, prefix):
    layer = mixer(name, chunk_size=4).eval()
    x = torch.randn(2, 17, 16)
    with torch.no_grad():
        full = layer(x, context())
        cache, steps = DecodeCache(), []
        for a, b in [(0, prefix), *((i, i + 1) for i in range(prefix, 17))]:
            cache.begin_step(b - a)
            steps.append(layer(x[:, a:b], context(cache=cache)))
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert len(cache.slots) == 1 and cache.slots[0]["state"] is not None


@pytest.mark.parametrize("name", NAMES)
def test_padded_positions_change_no_other_output(name):
    layer = mixer(name, chunk_size=4).eval()
    x = torch.randn(2, 12, 16)
    padding = torch.zeros(2, 12, dtype=torch.bool)
    padding[0, 3] = padding[0, 9:] = padding[1, 0] = True
    changed = x.clone()
    changed[padding] = 10 * torch.randn(int(padding.sum()), 16)
    before = layer(x, context(padding))
    after = layer(changed, context(padding))
    torch.testing.assert_close(after[~padding], before[~padding], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(layer(changed, context())[~padding], before[~padding], atol=1e-4)


def mamba2_by_steps(layer, x):
    """The Mamba-2 block one position at a time, as its recurrence reads: a sliding window of
    the convolution's inputs, h = exp(dt A) h + dt B^T x, y = C h + D x, RMSNorm(y silu(z))."""
    b, t, _ = x.shape
    heads, groups = layer.heads, layer.groups
    z, xbc, dt = layer.in_proj(x).split(layer.sizes, dim=-1)
    taps = layer.conv.weight[:, 0]  # (C, w)
    window = x.new_zeros(b, xbc.shape[-1], taps.shape[-1])  # the last w inputs, oldest first
    n = (layer.sizes[1] - layer.sizes[0]) // (2 * groups)
    h = x.new_zeros(b, heads, n, layer.sizes[0] // heads)  # (B, H, N, P)
    outs = []
    for i in range(t):
        window = torch.cat([window[..., 1:], xbc[:, i, :, None]], dim=-1)
        u = torch.nn.functional.silu((window * taps).sum(-1) + layer.conv.bias)
        xs, bs, cs = u.split([layer.sizes[0], groups * n, groups * n], dim=-1)
        xs = xs.view(b, heads, -1)  # (B, H, P)
        bs, cs = (y.view(b, groups, n).repeat_interleave(heads // groups, 1) for y in (bs, cs))
        step = torch.nn.functional.softplus(dt[:, i] + layer.dt_bias)[..., None, None]
        h = torch.exp(-step * layer.A_log.exp()[:, None, None]) * h \
            + step * bs[..., None] * xs[:, :, None]
        y = torch.einsum("bhn,bhnp->bhp", cs, h) + layer.D[:, None] * xs  # (B, H, P)
        y = (y.flatten(1) * torch.nn.functional.silu(z[:, i])).view(b, groups, -1)
        y = (y * torch.rsqrt(y.square().mean(-1, keepdim=True) + layer.norm.eps)).flatten(1)
        outs.append(layer.out(y * layer.norm.weight))
    return torch.stack(outs, dim=1)


def test_mamba2_equals_its_block_run_one_position_at_a_time():
    layer = mixer("mamba2", chunk_size=5)
    with torch.no_grad():
        layer.dt_bias.add_(1.0)  # larger steps: decays that matter within 17 positions
    x = torch.randn(2, 17, 16)
    torch.testing.assert_close(layer(x, context()), mamba2_by_steps(layer, x),
                               atol=1e-5, rtol=1e-5)


def test_the_papers_defaults_as_built():
    def build(name, d_model=512, n_heads=8):
        spec = yaml.safe_load((CONF_DIR / "attention" / f"{name}.yaml").read_text())
        dims = ModelDims(d_model=d_model, n_heads=n_heads, n_layers=2, d_ff=64, seq_len=64,
                         vocab_size=64)
        return build_token_mixer(spec, dims)

    retnet = build("retnet", n_heads=2)  # heads of 256 query/key dims, values and gate 2d wide
    assert retnet.heads == 2 and retnet.q.weight.shape == (512, 512)
    assert retnet.v.weight.shape == retnet.g.weight.shape == (1024, 512)
    assert retnet.out.weight.shape == (512, 1024) and retnet.scale == 256 ** -0.5
    for heads, log_gamma in [(2, retnet.log_decay.flatten()), (8, retention_decays(8))]:
        torch.testing.assert_close(log_gamma.exp(), 1 - 2.0 ** (-5 - torch.arange(float(heads))))
    assert build("retnet").heads == build("retnet", 128).heads == 8  # the model's, narrower

    gla = build("gla")  # 4 heads, d_k = d / 2, d_v = d, a rank-16 gate, tau = 16
    assert gla.heads == 4 and gla.q.weight.shape == gla.k.weight.shape == (256, 512)
    assert gla.v.weight.shape == (512, 512) and gla.gate_down.weight.shape == (16, 512)
    assert gla.gate_up.weight.shape == (256, 16) and gla.temperature == 16.0
    assert gla.scale == 64 ** -0.5

    mamba = build("mamba2")  # d_inner = 2d, heads of 64, N = 128, one group, conv width 4
    assert mamba.heads == 16 and mamba.sizes == [1024, 1024 + 2 * 128, 16]
    assert mamba.conv.weight.shape == (1280, 1, 4) and mamba.conv.bias is not None
    a = mamba.A_log.exp()
    assert ((a >= 1) & (a <= 16)).all() and torch.equal(mamba.D, torch.ones(16))
    dt = torch.nn.functional.softplus(mamba.dt_bias)
    assert ((dt >= 1e-3 * (1 - 1e-5)) & (dt <= 0.1 * (1 + 1e-5))).all()
    assert mamba.chunk_size == 256 and mamba.norm.rms and mamba.norm.groups == 1
    for layer in (retnet, gla, mamba):
        assert layer.provides == {"causal", "key_padding_mask", "variable_length"}
        assert layer.sub_quadratic and layer.decode_state == "recurrent"


def test_retnet_rotates_at_absolute_positions():
    """Retention scores depend on the distance only: the same query and key, rotated at
    positions (n, m) and (n + 7, m + 7), give the same product."""
    q, k = torch.randn(2, 1, 1, 1, 8).unbind(0)
    near = (rotate_pairs(q, 5) * rotate_pairs(k, 2)).sum()
    far = (rotate_pairs(q, 12) * rotate_pairs(k, 9)).sum()
    torch.testing.assert_close(near, far, atol=1e-5, rtol=1e-5)
    assert not math.isclose(near.item(), (q * k).sum().item(), abs_tol=1e-3)


# ---------------------------------------------------------------------------- the GPU path

HAS_FLA = importlib.util.find_spec("fla") is not None


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_FLA,
                    reason="needs a CUDA GPU and the fla package (pip install -e '.[fla]')")
@pytest.mark.parametrize("kind", KINDS)
def test_xbench_chunked_form_equals_flas_kernels_in_bf16(kind):
    q, k, v, g = (x.cuda() for x in inputs(kind, b=2, h=4, t=300, dk=64, dv=64,
                                          strength=0.2))
    state = torch.randn(2, 4, 64, 64, device="cuda")
    want, want_state = chunked_gated_linear(q, k, v, g, scale=64 ** -0.5, chunk=64, state=state)
    q, k, v = (x.bfloat16() for x in (q, k, v))
    got, got_state = fla_gated_linear(q, k, v, g, scale=64 ** -0.5, state=state, keep_state=True)

    def relative(a, b):
        return ((a.float() - b.float()).norm() / b.float().norm()).item()

    assert relative(got, want) < 0.02 and relative(got_state, want_state) < 0.02


@pytest.mark.skipif(not torch.cuda.is_available() or not HAS_FLA,
                    reason="needs a CUDA GPU and the fla package (pip install -e '.[fla]')")
@pytest.mark.parametrize("name", NAMES)
def test_each_mixer_on_cuda_takes_flas_path_and_agrees_with_the_chunked_form(name, monkeypatch):
    from xformer_bench.attention._ops import gated_linear as engine

    calls, real = [], engine.fla_gated_linear
    monkeypatch.setattr(engine, "fla_gated_linear",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    layer = mixer(name, d_model=128, **({"head_dim": 64, "d_state": 64}
                                         if name == "mamba2" else {})).cuda()
    x = torch.randn(2, 300, 128, device="cuda")
    results = []
    for fla in ("1", "0"):  # fla's kernels, then the chunked PyTorch form on the same GPU
        monkeypatch.setenv("XBENCH_FLA", fla)
        layer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x, context()).float()
        out.square().mean().backward()
        results.append([out] + [p.grad.float().clone() for p in layer.parameters()
                                if p.grad is not None])
    from xformer_bench.attention._ops.fla_kernels import _gated_backward_refused_here

    refused = name == "mamba2" and _gated_backward_refused_here()  # fla issue #640
    assert len(calls) == (0 if refused else 1)  # the first pass took fla's path unless refused
    for got, want in zip(*results):
        assert ((got - want).norm() / want.norm().clamp_min(1e-6)).item() < 0.05
