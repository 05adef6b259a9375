"""Softmax attention over logits that carry a learned term of their own: the engine of the
``synthesizer``, ``gaussian_prior``, ``talking_heads`` and ``adaptive_span`` variants.

* :func:`allowed_pairs` and :func:`masked_softmax` -- the dense path, for the variants whose
  paper computes every (query, key) pair (synthetic logits, mixing across heads, a prior over
  all pairs): causality and padding as a mask, a row with no valid key giving zero weights.
* :func:`plus_distance_term` -- a lazy :class:`~xformer_bench.position.PairBias` that adds a
  per-head function of the distance ``j - i`` (a Gaussian prior, a soft span mask) to the
  position scheme's own bias, evaluated only on the pairs a kernel computes.
* :func:`band_attention` -- each query attends the keys from ``before`` positions behind it
  to ``after`` ahead, blocks of queries against the keys gathered for them
  (:func:`~xformer_bench.attention._ops.sparse.block_sparse_attention`): O(T (before + after))
  time and memory, never T x T.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from xformer_bench.attention._ops.sparse import block_sparse_attention
from xformer_bench.position import PairBias

NEGATIVE = torch.finfo(torch.float32).min
"""The logit of a pair that does not count (finite, so an empty row stays finite)."""


def allowed_pairs(
    t_query: int,
    t_key: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
    device: torch.device | None = None,
) -> torch.Tensor:  # (Tq, S) bool, or (B, 1, Tq, S) with padding
    """The pairs that count; queries are the last ``t_query`` of the ``t_key`` positions."""
    query_position = torch.arange(t_key - t_query, t_key, device=device)[:, None]  # (Tq, 1)
    key_position = torch.arange(t_key, device=device)[None, :]  # (1, S)
    valid = (key_position <= query_position) | (not causal)  # (Tq, S)
    if key_padding_mask is not None:
        valid = valid & ~key_padding_mask[:, None, None, :]  # (B, 1, Tq, S)
    return valid


def masked_softmax(
    logits: torch.Tensor,  # (..., Tq, S)
    valid: torch.Tensor,  # bool, broadcastable to logits
) -> torch.Tensor:  # (..., Tq, S) float32: the weights, rows of no valid key all zero
    logits = logits.float().masked_fill(~valid, NEGATIVE)
    return logits.softmax(-1) * valid


def plus_distance_term(
    bias: PairBias | None,
    term: Callable[[torch.Tensor], torch.Tensor],  # distances (n,) long -> (H, n)
    t_query: int,
    t_key: int,
    device: torch.device,
) -> PairBias:
    """``bias`` (or nothing) plus ``term`` of the pairs' distance, lazily.  ``term`` is
    evaluated once per distance, -(S-1) .. S-1, and looked up per pair: one gather instead of
    its arithmetic on every pair (measured 7x faster, forward and backward, on a long band)."""
    table = term(torch.arange(1 - t_key, t_key, device=device))  # (H, 2S - 1)

    def at(query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:
        distance = key_index - (query_index + t_key - t_query)  # S: j - i in positions
        extra = table[:, distance + t_key - 1]  # (H, *S)
        return extra if bias is None else bias.at(query_index, key_index) + extra

    return PairBias(t_query, t_key, device, at)


def band_block(reach: int) -> int:
    """Queries per block for a band that reaches ``reach`` positions: a power of two near it,
    within [16, 128] (a block gathers ``block + reach`` keys: longer blocks waste masked pairs,
    shorter ones make many small matrix products)."""
    return min(128, max(16, 1 << (max(reach, 1).bit_length() - 1)))


def band_attention(
    q: torch.Tensor,  # (B, H, T, Dh)
    k: torch.Tensor,  # (B, H, S, Dh), S >= T: the queries are the last T positions
    v: torch.Tensor,  # (B, H, S, Dh)
    *,
    before: int,
    after: int,
    causal: bool,
    bias: PairBias | None = None,
    key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
) -> torch.Tensor:  # (B, H, T, Dh)
    """Query at position p attends the keys p - before .. p + after (p when causal), with the
    lazy ``bias`` evaluated on those pairs only."""
    t, s = q.shape[-2], k.shape[-2]
    after = 0 if causal else after
    before, after = min(before, s - 1), min(after, s - 1)  # no key lies further
    block = band_block(before + after)
    n_blocks = math.ceil(t / block)
    first = (s - t) + block * torch.arange(n_blocks, device=q.device)[:, None]  # (nb, 1)
    key_index = first - before + torch.arange(block + before + after, device=q.device)  # (nb, m)
    key_index = key_index.masked_fill((key_index < 0) | (key_index >= s), -1)

    def within_band(query_position: torch.Tensor, key_position: torch.Tensor) -> torch.Tensor:
        step = key_position - query_position  # (nb, block, m)
        return (step >= -before) & (step <= after)

    return block_sparse_attention(q, k, v, key_index, block, causal=causal, bias=bias,
                                  key_padding_mask=key_padding_mask, allowed=within_band)
