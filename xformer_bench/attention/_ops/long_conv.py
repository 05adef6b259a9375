"""Long convolutions by FFT, shared by the state-space and implicit-filter mixers (``s4d``,
``hyena``): per channel c, a filter k_c as long as the sequence,

    causal:      y_t = sum_{s <= t} k[t - s] u_s,
    two-sided:   y_t = sum_{s <= t} k[t - s] u_s + sum_{s > t} k'[s - t - 1] u_s,

over (..., C, T) inputs and (C, T) filters, time last; nothing of size T x T.

:func:`two_sided_conv` is the authors' form (S4's ``FFTConv``, Hyena's ``fftconv_ref``): one
real FFT zero-padded to 2T, so the circular product is the linear convolution, O(T log T) time
and O(T) memory.  Its two-sided filter is pad(k, (0, T)) + pad(flip(k'), (T, 0)) (S4's
bidirectional layer sums the two kernels so; the anticausal taps start one step ahead).

:func:`causal_conv` is the same convolution cut so that an output never rounds through a later
input: one FFT over the whole sequence mixes every position into every frequency, so a past
output moves by rounding (~1e-6) when a future input changes, which the project's causality
test (bit-exact, tests/test_attention.py) rejects.  The lower-triangular Toeplitz operator is
tiled instead -- diagonal blocks of ``chunk`` positions computed directly (a small Toeplitz
matmul), and, at each level s = chunk, 2 chunk, 4 chunk ..., every odd output block of s
positions fed by the even input block just before it (the bottom-left square of the level's
triangles), each square one FFT of 2s points.  Every (output t, input s <= t) pair falls in
exactly one tile, and every tile reads inputs no later than its outputs: exact causality,
O(T log^2 T) time, the largest tensor O(T C) (the per-level spectra kept for backward sum to
O(T C log T)).  The input is zero-padded at the end to chunk x 2^levels.

Both run in float32 with autocast off (``torch.fft`` has no bfloat16; cuFFT needs powers of two
in half precision) and return the input's dtype.  On a GPU the same code runs on cuFFT.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from xformer_bench.attention._ops.feature_maps import full_precision


def causal_conv(u: torch.Tensor, k: torch.Tensor, *, chunk: int) -> torch.Tensor:
    """y_t = sum_{s <= t} k[:, t - s] u[..., s]: u (..., C, T), k (C, >= T) -> (..., C, T),
    exactly causal (tiled, see the module docstring)."""
    t = u.shape[-1]
    c = max(1, min(chunk, t))
    total = c * 2 ** math.ceil(math.log2(-(-t // c)))  # chunk x a power of two, >= T
    wide = torch.promote_types(u.dtype, torch.float32)
    with full_precision(u):
        x = F.pad(u.to(wide), (0, total - t))  # (..., C, total)
        taps = F.pad(k[..., :t].to(wide), (0, total - t))  # (C, total)
        y = _diagonal_blocks(x, taps[..., :c], c).contiguous()
        s = c
        while s < total:
            _add_squares(y, x, taps[..., :2 * s], s)
            s *= 2
    return y[..., :t].to(u.dtype)


def _diagonal_blocks(x: torch.Tensor, taps: torch.Tensor, c: int) -> torch.Tensor:
    """Within each block of c positions: y_i = sum_{j <= i} taps[i - j] x_j, one (rows, c) x
    (c, c) matmul per channel with the lower-triangular Toeplitz matrix."""
    lag = torch.arange(c, device=x.device)[:, None] - torch.arange(c, device=x.device)  # i - j
    toeplitz = taps[:, lag.clamp(min=0)] * (lag >= 0)  # (C, c, c): 0 above the diagonal
    rows = x.unflatten(-1, (-1, c)).movedim(-3, 0)  # (C, ..., n, c)
    y = rows.reshape(rows.shape[0], -1, c) @ toeplitz.transpose(-1, -2)  # (C, rows, c)
    return y.view(rows.shape).movedim(0, -3).flatten(-2)  # (..., C, n c)


def _add_squares(y: torch.Tensor, x: torch.Tensor, taps: torch.Tensor, s: int) -> None:
    """Level s, added into y in place: odd output block 2m + 1 (s positions) from even input
    block 2m, lags 1 .. 2s - 1 -- the 2s-point circular convolution of the input block with
    taps[0 : 2s], read at s .. 2s - 1 (no wrap-around there)."""
    pairs = x.unflatten(-1, (-1, 2, s))  # (..., C, m, 2, s)
    spectrum = torch.fft.rfft(pairs[..., 0, :], n=2 * s) * torch.fft.rfft(taps, n=2 * s)[:, None]
    y.unflatten(-1, (-1, 2, s))[..., 1, :] += torch.fft.irfft(spectrum, n=2 * s)[..., s:]


def two_sided_conv(u: torch.Tensor, k: torch.Tensor, k_ahead: torch.Tensor) -> torch.Tensor:
    """y_t = sum_{s <= t} k[t - s] u_s + sum_{s > t} k_ahead[s - t - 1] u_s by one FFT of 2T
    points: u (..., C, T), k and k_ahead (C, >= T) -> (..., C, T)."""
    t = u.shape[-1]
    wide = torch.promote_types(u.dtype, torch.float32)
    with full_precision(u):
        ahead = k_ahead[..., :t].to(wide).flip(-1)
        both = F.pad(k[..., :t].to(wide), (0, t)) + F.pad(ahead, (t, 0))  # (C, 2T)
        spectrum = torch.fft.rfft(u.to(wide), n=2 * t) * torch.fft.rfft(both, n=2 * t)
        y = torch.fft.irfft(spectrum, n=2 * t)[..., :t]
    return y.to(u.dtype)
