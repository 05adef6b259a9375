"""Gated linear attention, the computation ``retnet``, ``gla`` and ``mamba2`` share: a matrix
state S (Dk, Dv) per head, decayed along its key dimension and written by each key and value,

    S_t = diag(a_t) S_{t-1} + k_t^T v_t,        o_t = scale * q_t S_t,        a_t = exp(g_t),

with log-decays g_t <= 0 of three granularities, one engine for all (Yang et al. 2024, GLA,
section 2; Dao & Gu 2024, SSD, section 7):

* fixed per head, g (1, H, 1, 1): RetNet's log gamma_h (Sun et al. 2023, eq. 1-6);
* data-dependent per head and position, g (B, H, T, 1): Mamba-2's A dt_t;
* data-dependent per key dimension, g (B, H, T, Dk): GLA's log alpha_t.

**Chunked form** (:func:`chunked_gated_linear`, the CPU path): chunks of n positions, parallel
within a chunk and recurrent across chunks.  With b_i the cumulative log-decay from the chunk's
start to position i (inclusive) and S_0 the state before the chunk,

    o_i = scale [ (q_i * exp(b_i)) S_0 + sum_{j<=i} (sum_d q_id k_jd exp(b_id - b_jd)) v_j ],
    S_n = exp(b_n) * S_0 + sum_j (k_j * exp(b_n - b_j))^T v_j.

Every exponent is <= 0 (b_i - b_j for j <= i, b_n - b_j, b_i, b_n): nothing is exponentiated
that can overflow -- unlike the form q_i exp(b_i) . k_j exp(-b_j), whose exp(-b_j) overflows
float32 once a chunk's decay passes e^-88.  The pairs j > i are set to -inf before the
exponential (exact zeros, so a future position never changes a past output's rounding).  The
intra-chunk decay matrix is (n, n) per head for scalar decays, (n, n, Dk) for vector ones (so
GLA's chunks are short).  The chunks' local terms are computed all at once; only the state is
carried from chunk to chunk, one (Dk, Dv) state per chunk kept: O(T (n + Dk Dv / n)) memory
for scalar decays, O(T (n Dk + Dk Dv / n)) for vector ones, never a T x T tensor.

**Step** (:func:`gated_linear_step`): the recurrence itself, for decoding one token at a time.

**GPU** (:func:`fla_gated_linear`): with CUDA tensors and the optional ``fla`` package, its
Triton kernels for the same sums -- ``chunk_simple_gla`` (scalar decays: ``g_gamma`` fixed per
head, ``g`` per position) and ``chunk_gla`` (per key dimension).

Sums in float32 with autocast off; the output is returned in the dtype of ``v`` and the state in
float32.  Padding (``key_padding_mask``): a padded position neither writes (k = 0) nor decays
(g = 0) the state, so its contents reach no other position.  :class:`GroupNorm` is the per-head
(per-group) normalisation all three apply to the output.  The naive references (the step-by-step
recurrence and the parallel T x T form) are in ``tests/test_mixer_gated_linear.py``.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention._ops.feature_maps import full_precision
from xformer_bench.attention._ops.fla_kernels import use_fla


def gated_linear(
    q: torch.Tensor,  # (B, H, T, Dk)
    k: torch.Tensor,  # (B, H, T, Dk)
    v: torch.Tensor,  # (B, H, T, Dv)
    g: torch.Tensor,  # log-decays <= 0: (1, H, 1, 1), (B, H, T, 1) or (B, H, T, Dk)
    *,
    scale: float,
    chunk: int,
    state: torch.Tensor | None = None,  # (B, H, Dk, Dv) float32: the state before position 0
    keep_state: bool = False,
    key_padding_mask: torch.Tensor | None = None,  # (B, T) bool, True = padding
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, H, T, Dv), the state after the last
    """The mixers' entry point.  Decoding (``keep_state``) one position: the step; CUDA with
    ``fla``: its kernels; anything else: the chunked form.  The state after the last position
    is returned with ``keep_state`` (and on the CPU path, where it costs nothing), else None."""
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, :, None]  # (B, 1, T, 1)
        k = k.masked_fill(pad, 0.0)
        g = g.expand(*k.shape[:3], g.shape[-1]).masked_fill(pad, 0.0)
    if keep_state and q.shape[-2] == 1:
        return gated_linear_step(q, k, v, g, state, scale=scale)
    per_position = g.shape[-1] == 1 and (g.shape[0] > 1 or g.shape[2] > 1)  # scalar, per step
    if use_fla(q, gated=per_position):
        return fla_gated_linear(q, k, v, g, scale=scale, state=state, keep_state=keep_state)
    return chunked_gated_linear(q, k, v, g, scale=scale, chunk=chunk, state=state)


def chunked_gated_linear(q, k, v, g, *, scale: float, chunk: int,
                         state: torch.Tensor | None = None):
    """The chunked form (module docstring): (B, H, T, Dv) in the dtype of ``v``, and the
    final state (B, H, Dk, Dv) in float32."""
    if chunk < 1:
        raise ValueError(f"chunk={chunk} must be positive")
    with full_precision(v):
        out, state = _chunked(*(x.float() for x in (q, k, v, g)), scale, chunk, state)
    return out.to(v.dtype), state


def _chunked(q, k, v, g, scale, chunk, state):
    b, h, t, dk = q.shape
    dv = v.shape[-1]
    g = g.expand(b, h, t, g.shape[-1])  # (B, H, T, G), G = 1 or Dk
    n = min(chunk, t)
    pad = -t % n  # zeros at the end: no key, no decay, so the final state is unchanged
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
    q, k, v, g = (x.unflatten(2, (-1, n)) for x in (q, k, v, g))  # (B, H, N, n, .)
    cum = g.cumsum(-2)  # (B, H, N, n, G): b_i, from the chunk's start
    last = cum[..., -1:, :]  # (B, H, N, 1, G): b_n
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)  # j > i
    if cum.shape[-1] == 1:  # scalar decays: an (n, n) decay matrix per chunk and head
        gap = cum - cum.transpose(-1, -2)  # (B, H, N, n, n): b_i - b_j
        scores = (q @ k.transpose(-1, -2)) * gap.masked_fill(future, float("-inf")).exp()
    else:  # per key dimension: (n, n, Dk), the decay of each key dimension between i and j
        gap = cum[..., :, None, :] - cum[..., None, :, :]  # (B, H, N, n, n, Dk)
        decay = gap.masked_fill(future[..., None], float("-inf")).exp()
        scores = torch.einsum("...id,...jd,...ijd->...ij", q, k, decay)  # (B, H, N, n, n)
    inner = scores @ v  # (B, H, N, n, Dv)
    written = (k * (last - cum).exp()).transpose(-1, -2) @ v  # (B, H, N, Dk, Dv)
    kept = last.exp().transpose(-1, -2)  # (B, H, N, G, 1): the decay across a whole chunk
    s = q.new_zeros(b, h, dk, dv) if state is None else state.float()
    starts = []  # the state before each chunk
    # unbind, not kept[:, :, c]: one backward for all chunks, where each indexing's backward
    # would zero-fill a whole (B, H, N, Dk, Dv) gradient -- O(N^2) time in the chunks
    for kept_c, written_c in zip(kept.unbind(2), written.unbind(2)):
        starts.append(s)
        s = kept_c * s + written_c
    carried = (q * cum.exp()) @ torch.stack(starts, dim=2)  # (B, H, N, n, Dv)
    out = ((inner + carried) * scale).flatten(2, 3)[:, :, :t]  # (B, H, T, Dv)
    return out, s


def gated_linear_step(q, k, v, g, state: torch.Tensor | None, *, scale: float):
    """The recurrence over the T given positions one at a time (decoding: T = 1):
    S = exp(g_t) * S + k_t^T v_t, o_t = scale q_t S; returns (B, H, T, Dv) and S (float32)."""
    b, h, t, dk = q.shape
    with full_precision(v):
        s = q.new_zeros(b, h, dk, v.shape[-1], dtype=torch.float32) if state is None else state
        g = g.float().expand(b, h, t, g.shape[-1])
        outs = []
        for i in range(t):
            written = k[:, :, i, :, None].float() * v[:, :, i, None].float()  # (B, H, Dk, Dv)
            s = g[:, :, i, :, None].exp() * s + written
            outs.append(scale * (q[:, :, i, None].float() @ s))  # (B, H, 1, Dv)
    return torch.cat(outs, dim=2).to(v.dtype), s


@functools.cache
def _fla():
    """``fla``'s two kernels, or None when the package is not installed (looked up once)."""
    try:
        from fla.ops.gla import chunk_gla
        from fla.ops.simple_gla import chunk_simple_gla
    except ImportError:
        return None
    return chunk_gla, chunk_simple_gla


def fla_gated_linear(q, k, v, g, *, scale: float, state: torch.Tensor | None = None,
                     keep_state: bool = False):
    """The same sums by flash-linear-attention's Triton kernels (``fla`` >= 0.3, layout
    (B, T, H, D)): ``chunk_simple_gla`` with ``g_gamma`` (H,) for a fixed decay per head or
    ``g`` (B, T, H) per position, ``chunk_gla`` with ``g`` (B, T, H, Dk) per key dimension.
    q, k, v go in one dtype (the wider of q's and v's); the output comes back in it."""
    chunk_gla, chunk_simple_gla = _fla()
    b, h, t, dk = q.shape
    dtype = torch.promote_types(q.dtype, v.dtype)  # one dtype for the kernels (Mamba-2's dt x
    q, k, v = (x.to(dtype).transpose(1, 2).contiguous() for x in (q, k, v))  # is float32)
    common = dict(scale=scale, initial_state=None if state is None else state.float(),
                  output_final_state=keep_state)
    if g.shape[-1] > 1:
        g = g.float().expand(b, h, t, dk).transpose(1, 2).contiguous()  # (B, T, H, Dk)
        out, final = chunk_gla(q, k, v, g=g, **common)
    elif g.shape[0] == 1 and g.shape[2] == 1:
        out, final = chunk_simple_gla(q, k, v, g_gamma=g.float().view(h), **common)
    else:
        g = g.float().expand(b, h, t, 1)[..., 0].transpose(1, 2).contiguous()  # (B, T, H)
        out, final = chunk_simple_gla(q, k, v, g=g, **common)
    return out.transpose(1, 2), final


class GroupNorm(nn.Module):
    """GroupNorm over channels at each position (Wu & He 2018): each of ``groups`` contiguous
    groups of C / groups channels normalised by its own statistics (its mean and variance, or
    with ``rms`` its root mean square alone), then a per-channel gain (and bias) when
    ``affine``.  (B, T, C) -> (B, T, C), computed in float32."""

    def __init__(self, channels: int, groups: int, *, eps: float, rms: bool = False,
                 affine: bool = True):
        super().__init__()
        self.groups, self.eps, self.rms = groups, eps, rms
        self.weight = nn.Parameter(torch.ones(channels)) if affine else None
        self.bias = nn.Parameter(torch.zeros(channels)) if affine and not rms else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float().unflatten(-1, (self.groups, -1))  # (B, T, groups, C / groups)
        if not self.rms:
            y = y - y.mean(-1, keepdim=True)
        y = (y * torch.rsqrt(y.square().mean(-1, keepdim=True) + self.eps)).flatten(-2)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y.to(x.dtype)
