"""Attention over chosen keys, the building block of the sparse and clustered kernels.

:func:`masked_attention` is softmax attention of queries over keys given explicitly, any
leading dimensions, with a validity mask: it never sees a key it is not given, so its cost is
that of the keys a kernel chose.  :func:`block_sparse_attention` chooses them by index: the
queries are cut into blocks of ``block`` consecutive positions, and each block (or each query)
attends to the keys a kernel lists for it -- a sliding window, a dilated band, a few global
positions -- gathered, never masked out of a T x T matrix.  Memory is O(T * m) for m keys per
block, plus the gathered keys and values, O(T * m / block * Dh).

Rows with no valid key (a fully padded window) give a zero output and finite gradients; their
log-normaliser is a very large negative number, so combining rounds (LSH) gives them no weight.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from xformer_bench.position import PairBias

Allowed = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``allowed(query_position, key_position) -> bool``: a kernel's own rule on the pairs it
gathered (e.g. the exact extent of a sliding window), on broadcastable long tensors."""


NEGATIVE = torch.finfo(torch.float32).min
"""The logit of a key a query may not see."""


def softmax_attention(
    scores: torch.Tensor,  # (..., Tq, Tk)
    allowed: torch.Tensor,  # bool, broadcastable to (..., Tq, Tk)
    v: torch.Tensor,  # (..., Tk, Dv)
) -> tuple[torch.Tensor, torch.Tensor]:  # (..., Tq, Dv), log-normaliser (..., Tq)
    """Softmax attention over the allowed keys: the output (0 for a row with none) and the
    log-normaliser, ``logsumexp`` in value and gradient, taken as ``max - log(max softmax)``.
    Not ``exp(scores - logsumexp)``: on CPU, exp of a masked -3.4e38 takes a slow path (4x
    the time of ordinary inputs), which the fused softmax avoids."""
    scores = scores.float().masked_fill(~allowed, NEGATIVE)
    top = scores.amax(dim=-1, keepdim=True)  # (..., Tq, 1)
    weights = scores.softmax(dim=-1)  # (..., Tq, Tk)
    lse = (top - weights.amax(dim=-1, keepdim=True).log()).squeeze(-1)  # d lse / d scores = weights
    out = weights.to(v.dtype) @ v  # (..., Tq, Dv)
    return out.masked_fill(top == NEGATIVE, 0), lse


def masked_attention(
    q: torch.Tensor,  # (..., Tq, Dh)
    k: torch.Tensor,  # (..., Tk, Dh)
    v: torch.Tensor,  # (..., Tk, Dv)
    valid: torch.Tensor,  # bool, broadcastable to (..., Tq, Tk)
    bias: torch.Tensor | None = None,  # additive, broadcastable to (..., Tq, Tk)
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # (..., Tq, Dv), log-normaliser (..., Tq)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-1, -2)) * scale  # (..., Tq, Tk)
    if bias is not None:
        scores = scores + bias
    return softmax_attention(scores, valid, v)


def gather_positions(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (B, H, S, D) at ``index`` (any shape of long): (B, H, *index.shape, D)."""
    return x[:, :, index]


def block_sparse_attention(
    q: torch.Tensor,  # (B, H, T, Dh)
    k: torch.Tensor,  # (B, H, S, Dh), S >= T: the queries are the last T positions
    v: torch.Tensor,  # (B, H, S, Dh)
    key_index: torch.Tensor,  # (nb, m) per query block, or (nb, block, m) per query; -1: none
    block: int,
    *,
    causal: bool,
    bias: PairBias | None = None,
    key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
    allowed: Allowed | None = None,
) -> torch.Tensor:  # (B, H, T, Dh)
    """Each block of ``block`` queries attends to the keys ``key_index`` lists for it.

    A key listed twice for one query counts twice: kernels list each key once (or -1).
    """
    b, h, t, dh = q.shape
    s = k.shape[-2]
    n_blocks = key_index.shape[0]
    if n_blocks * block < t:
        raise ValueError(f"{n_blocks} blocks of {block} do not cover {t} queries")
    per_query = key_index.dim() == 3
    q_blocks = F.pad(q, (0, 0, 0, n_blocks * block - t)).view(b, h, n_blocks, block, dh)
    query_index = torch.arange(n_blocks * block, device=q.device).view(n_blocks, block, 1)
    query_position = query_index + (s - t)  # (nb, block, 1) in key positions
    listed = key_index if per_query else key_index[:, None, :]  # (nb, 1|block, m)
    safe = listed.clamp(min=0)
    valid = (listed >= 0) & (query_index < t)  # (nb, block, m)
    if causal:
        valid = valid & (safe <= query_position)
    if allowed is not None:
        valid = valid & allowed(query_position, safe)
    gathered = safe if per_query else key_index.clamp(min=0)  # (nb, block, m) or (nb, m)
    keys, values = gather_positions(k, gathered), gather_positions(v, gathered)
    valid = valid[None, None]  # (1, 1, nb, block, m)
    if key_padding_mask is not None:
        valid = valid & ~key_padding_mask[:, safe][:, None]  # (B, 1, nb, block, m)
    pair_bias = None
    if bias is not None:
        pair_bias = bias.at(query_index.clamp(max=t - 1), safe)  # (H|B,H, nb, block, m)
    if per_query:  # one query against its own keys: (..., nb, block, 1, m)
        out, _ = masked_attention(
            q_blocks.unsqueeze(-2), keys, values, valid.unsqueeze(-2),
            None if pair_bias is None else pair_bias.unsqueeze(-2))
        out = out.squeeze(-2)
    else:
        out, _ = masked_attention(q_blocks, keys, values, valid, pair_bias)
    return out.reshape(b, h, n_blocks * block, dh)[:, :, :t]
