"""Long convolutions: ``s4d`` (Gu et al. 2022) and ``hyena`` (Poli et al. 2023) and
their shared FFT engine (:mod:`xformer_bench.attention._ops.long_conv`).

* the FFT convolutions equal the direct sums, forward and gradients, at chunk sizes that do
  and do not divide T, and the tiled causal one never rounds through a later input;
* s4d: its Vandermonde kernel applied by FFT equals the unrolled recurrence
  x_t = Abar x_{t-1} + u_t, y_t = 2 Re(C' x_t) + D u_t (both directions), forward and gradients
  of the whole layer; recurrent decoding equals the forward pass;
* hyena: the FFT operator equals the direct convolution with its filter taps, forward and
  gradients; the filter is defined past the training length; decoding from the kept history equals the
  forward pass;
* both: the paper's defaults as built, exact causality across chunk edges, key padding.

fla has no S4D or Hyena kernel: their GPU path is torch's cuFFT through the same code, so there
is no fla equivalence test here; the CUDA test compares that path with the CPU's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from xformer_bench.attention._ops.long_conv import causal_conv, two_sided_conv
from xformer_bench.attention.s4d import ssm_kernel
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position

CHUNKS = (1, 3, 4, 7, 64)  # 3 and 7 do not divide the lengths below; 64 exceeds them


def dims(d_model: int = 16, seq_len: int = 16) -> ModelDims:
    return ModelDims(d_model=d_model, n_heads=2, n_layers=2, d_ff=32, seq_len=seq_len,
                     vocab_size=64)


def layer(name: str, **keys):
    torch.manual_seed(0)
    return build_token_mixer({"name": name, **keys}, dims())


def ctx(causal: bool = True, **fields) -> ForwardContext:
    return ForwardContext(Position(), causal=causal, **fields)


def direct_conv(u: torch.Tensor, k: torch.Tensor, k_ahead: torch.Tensor | None = None):
    """sum_{s <= t} k[t - s] u_s (+ sum_{s > t} k_ahead[s - t - 1] u_s) through a materialised
    (C, T, T) Toeplitz matrix: u (B, C, T), k (C, T)."""
    t = u.shape[-1]
    lag = torch.arange(t)[:, None] - torch.arange(t)  # t - s
    toeplitz = k[:, lag.clamp(min=0)] * (lag >= 0)
    if k_ahead is not None:
        toeplitz = toeplitz + k_ahead[:, (-lag - 1).clamp(min=0)] * (lag < 0)
    return torch.einsum("cts,bcs->bct", toeplitz, u)


def grads(out: torch.Tensor, *tensors) -> list[torch.Tensor]:
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return list(torch.autograd.grad((out * weights).sum(), tensors))


# ------------------------------------------------------------------ the FFT engine

@pytest.mark.parametrize("chunk", CHUNKS)
def test_the_fft_convolutions_equal_the_direct_sums_with_gradients(chunk):
    torch.manual_seed(0)
    u = torch.randn(2, 3, 21, requires_grad=True)
    k, k_ahead = torch.randn(2, 3, 21, requires_grad=True).unbind(0)
    cases = ((causal_conv(u, k, chunk=chunk), direct_conv(u, k), (u, k)),
             (two_sided_conv(u, k, k_ahead), direct_conv(u, k, k_ahead), (u, k, k_ahead)))
    for fast, slow, inputs in cases:
        torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
        for a, b in zip(grads(fast, *inputs), grads(slow, *inputs)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_the_tiled_causal_convolution_never_rounds_through_a_later_input():
    """One 2T-point FFT moves past outputs by rounding when a later input changes; the tiled
    form leaves them bit-identical (tests/test_attention.py's causality is exact)."""
    torch.manual_seed(0)
    u, k = torch.randn(2, 8, 45), torch.randn(8, 45)
    for chunk in (3, 4, 16):
        before = causal_conv(u, k, chunk=chunk)
        for first in (1, 4, 12, 13, 30, 44):
            changed = u.clone()
            changed[..., first:] += torch.randn_like(changed[..., first:])
            after = causal_conv(changed, k, chunk=chunk)
            assert torch.equal(before[..., :first], after[..., :first]), (chunk, first)
    plain = two_sided_conv(u, k, torch.zeros_like(k))  # causal in exact arithmetic only
    changed = u.clone()
    changed[..., 30:] += 1.0
    replain = two_sided_conv(changed, k, torch.zeros_like(k))
    assert not torch.equal(plain[..., :30], replain[..., :30])


# ------------------------------------------------------------------ s4d


def s4d_by_recurrence(mixer, x: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """The layer as its recurrence, one position at a time: x_t = Abar x_{t-1} + u_t,
    y_t = 2 Re(C' x_t) (+ the anticausal SSM over u_{t+1}, ...), + D u_t, GELU, out, GLU."""
    dta, coeff = mixer.discretised(2)  # (H, M), (2, H, M)
    abar, u = dta.exp(), x.transpose(1, 2)  # (H, M), (B, H, T)
    t_len = u.shape[-1]
    state = torch.zeros(*u.shape[:2], abar.shape[-1], dtype=abar.dtype)
    ys = []
    for t in range(t_len):
        state = abar * state + u[..., t, None]
        ys.append(2 * (coeff[0] * state).sum(-1).real)
    y = torch.stack(ys, dim=-1)
    if not causal:  # state at t holds sum_{s > t} Abar^(s - t - 1) u_s
        state, back = torch.zeros_like(state), [None] * t_len
        for t in reversed(range(t_len)):
            back[t] = 2 * (coeff[1] * state).sum(-1).real
            state = abar * state + u[..., t, None]
        y = y + torch.stack(back, dim=-1)
    y = F.gelu(y + u * mixer.d[:, None])
    return F.glu(mixer.out(y.transpose(1, 2)), dim=-1)


def test_the_vandermonde_kernel_in_chunks_is_the_authors_direct_one():
    torch.manual_seed(0)
    dta = torch.complex(-torch.rand(3, 5), torch.randn(3, 5)) * 0.3
    coeff = torch.randn(2, 3, 5, dtype=torch.cfloat)
    direct = 2 * torch.einsum("chn,hnl->chl", coeff,
                              torch.exp(dta[..., None] * torch.arange(23))).real
    for chunk in CHUNKS:
        torch.testing.assert_close(ssm_kernel(dta, coeff, 23, chunk), direct, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("chunk", CHUNKS)
def test_s4d_convolution_equals_its_recurrence_with_gradients(chunk, causal):
    mixer = layer("s4d", chunk_size=chunk, d_state=8)
    x = torch.randn(2, 21, 16, requires_grad=True)
    fast, slow = mixer(x, ctx(causal)), s4d_by_recurrence(mixer, x, causal)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    tensors = [x, *mixer.parameters()]
    for a, b in zip(grads(fast, *tensors), grads(slow, *tensors)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def decoded(mixer, x: torch.Tensor, steps: list[int]) -> torch.Tensor:
    """The mixer run through a DecodeCache, ``steps`` new positions at a time."""
    cache, outs, start = DecodeCache(), [], 0
    for n in steps:
        cache.begin_step(n)
        outs.append(mixer(x[:, start:start + n], ctx(cache=cache)))
        start += n
    return torch.cat(outs, dim=1)


STEPS = {"one at a time": [1] * 37, "a prompt, then one at a time": [7] + [1] * 30,
         "several at a time": [5, 3, 9, 1, 11, 8]}


@pytest.mark.parametrize("name", ["s4d", "hyena"])
@pytest.mark.parametrize("steps", list(STEPS), ids=list(STEPS))
def test_decoding_equals_the_forward_pass(name, steps):
    mixer = layer(name, chunk_size=4).eval()
    x = torch.randn(2, 37, 16)
    with torch.no_grad():
        torch.testing.assert_close(decoded(mixer, x, STEPS[steps]), mixer(x, ctx()),
                                   atol=1e-5, rtol=1e-4)


def test_s4d_decodes_with_a_state_of_n_over_2_complex_modes_per_channel():
    mixer = layer("s4d").eval()
    cache = DecodeCache()
    for _ in range(3):
        cache.begin_step(1)
        mixer(torch.randn(2, 1, 16), ctx(cache=cache))
    state = cache.slots[0]["state"]
    assert state.shape == (2, 16, 32) and state.dtype == torch.complex64


def test_s4d_defaults_are_the_papers():
    mixer = layer("s4d")
    dta, coeff = mixer.discretised(2)
    a = dta / mixer.log_dt.exp()[:, None]
    torch.testing.assert_close(a.real, torch.full((16, 32), -0.5))  # S4D-Lin
    torch.testing.assert_close(a.imag, math.pi * torch.arange(32.0).expand(16, 32))
    dt = mixer.log_dt.exp()
    assert (dt >= 0.001).all() and (dt <= 0.1).all() and coeff.shape == (2, 16, 32)
    assert mixer.out.out_features == 32  # d -> 2d, halved by the GLU
    assert mixer.decode_state == "recurrent" and mixer.sub_quadratic
    assert all(p.dim() == 1 for n, p in mixer.named_parameters() if not n.startswith("out."))


# ------------------------------------------------------------------ hyena


def hyena_direct(mixer, x: torch.Tensor) -> torch.Tensor:
    """The operator with its long convolution as a materialised Toeplitz product."""
    u = mixer.in_proj(x).transpose(1, 2)
    x0, x1, v = mixer.short(F.pad(u, (mixer.reach - 1, 0))).split(mixer.width, dim=1)
    z = x1 * v
    y = x0 * (direct_conv(z, mixer.filter(x.shape[1])) + z * mixer.beta[:, None])
    return mixer.out(y.transpose(1, 2))


@pytest.mark.parametrize("chunk", CHUNKS)
def test_hyena_fft_operator_equals_the_direct_convolution_with_gradients(chunk):
    mixer = layer("hyena", chunk_size=chunk)
    x = torch.randn(2, 21, 16, requires_grad=True)
    fast, slow = mixer(x, ctx()), hyena_direct(mixer, x)
    torch.testing.assert_close(fast, slow, atol=1e-5, rtol=1e-5)
    tensors = [x, *mixer.parameters()]
    for a, b in zip(grads(fast, *tensors), grads(slow, *tensors)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_hyena_filter_is_defined_past_the_training_length():
    """L is the training length (t = 1 at its last position); longer inputs get t > 1; an
    integer position_scale makes the filter independent of data.seq_len."""
    short = build_token_mixer({"name": "hyena"}, dims(seq_len=8))
    assert short.filter.scale == 8
    torch.testing.assert_close(short.filter(40)[:, 30:], short.filter(10, start=30))
    assert short(torch.randn(1, 100, 16), ctx()).shape == (1, 100, 16)
    torch.manual_seed(0)
    fixed = build_token_mixer({"name": "hyena", "position_scale": 64}, dims(seq_len=8))
    torch.manual_seed(0)
    longer = build_token_mixer({"name": "hyena", "position_scale": 64}, dims(seq_len=4096))
    torch.testing.assert_close(fixed.filter(40)[:, :10], longer.filter(10))


def test_hyena_defaults_are_the_papers():
    mixer = layer("hyena")
    widths = [(m.in_features, m.out_features) for m in mixer.filter.layers]
    assert widths == [(33, 64), (64, 64), (64, 64), (64, 16)]
    assert mixer.filter.layers[-1].bias is None
    torch.testing.assert_close(mixer.filter.freq, torch.full((64,), 14.0))
    assert mixer.in_proj.out_features == 48 and mixer.short.kernel_size == (3,)
    deltas = mixer.filter.deltas  # the window reaches 1e-2 at t = 1.5 (slowest) .. 0.3 (fastest)
    torch.testing.assert_close(deltas[[0, -1]], torch.tensor([math.log(100) / 1.5,
                                                              math.log(100) / 0.3]))
    assert mixer.provides == {"causal", "key_padding_mask", "variable_length"}
    assert mixer.decode_state == "history" and mixer.sub_quadratic


# ------------------------------------------------------------------ both


@pytest.mark.parametrize("name", ["s4d", "hyena"])
def test_changing_a_later_position_leaves_earlier_outputs_bit_identical(name):
    for chunk in (3, 5):
        mixer = layer(name, chunk_size=chunk).eval()
        x = torch.randn(2, 40, 16)
        with torch.no_grad():
            before = mixer(x, ctx())
            for first in (1, 3, 5, 6, 10, 15, 24, 39):
                changed = x.clone()
                changed[:, first:] = torch.randn_like(changed[:, first:])
                assert torch.equal(mixer(changed, ctx())[:, :first], before[:, :first])


@pytest.mark.parametrize("name", ["s4d", "hyena"])
def test_padded_positions_reach_no_other_position(name):
    mixer = layer(name, chunk_size=4).eval()
    modes = [True, False] if name == "s4d" else [True]
    padding = torch.zeros(2, 24, dtype=torch.bool)
    padding[0, 5:9] = True
    padding[1, 20:] = True
    x = torch.randn(2, 24, 16)
    changed = torch.where(padding[..., None], torch.randn_like(x), x)
    for causal in modes:
        with torch.no_grad():
            a = mixer(x, ctx(causal, key_padding_mask=padding))
            b = mixer(changed, ctx(causal, key_padding_mask=padding))
        torch.testing.assert_close(a[~padding], b[~padding], atol=1e-6, rtol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["s4d", "hyena"])
def test_the_cuda_path_under_bf16_equals_the_cpu_path(name):
    """fla has no S4D or Hyena kernel: the GPU path is this code on cuFFT (bf16 autocast, the
    convolutions in float32)."""
    mixer = layer(name)
    x = torch.randn(2, 300, 16)
    expected = mixer(x, ctx())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = mixer.cuda()(x.cuda(), ctx()).float().cpu()
    assert (got - expected).norm() / expected.norm() < 0.03
