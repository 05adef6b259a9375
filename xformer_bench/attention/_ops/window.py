"""Windowed attention, computed blockwise: the engine of the ``local``, ``block_local``,
``dilated``, ``longformer`` and ``bigbird`` kernels.

:func:`windowed_attention` cuts the queries into blocks of ``block`` consecutive positions.
Block n takes the keys from ``before`` positions before its first query to ``after`` positions
after its last -- one ``index_select`` of contiguous rows (cheaper to differentiate than an
``unfold`` view), never a mask over all keys -- and each query keeps those within its own
band ``[p - before, p + after]`` (``sliding``: Beltagy et al. 2020's sliding window) or all of
them (``sliding=False``: Parmar et al. 2018's query block with its memory, BigBird's window
blocks).  Shared windows lie at absolute positions (block n: lane steps n * block ..; the
queries are the last T of S), so the queries of a decode step over cached keys see what they
see in the full pass; sliding bands, the same however the blocks lie, are cut from the first
query (no padding).  With a dilation d the positions are first dealt into d lanes
by residue modulo d (lane r holds r, r + d, r + 2d, ...): a dilated band is a contiguous band
within one lane, so the same code computes both, ``before`` and ``after`` then counting steps
of d positions.  A block may also attend ``extra_keys`` listed for it (BigBird's random blocks),
gathered by index.  The blocks then attend as the heads of one ``scaled_dot_product_attention``
call with an additive mask (the pairs outside the pattern at the lowest finite value, plus the
bias): on CPU its fused kernel never holds a block's scores.  Cost: T * (block + before + after
+ extras) pairs per head, never T x T; the mask of a shape is built once and cached.

Global tokens (Beltagy et al. 2020, Zaheer et al. 2020) are the first ``n_global`` key
positions.  Every query attends them: they join each block's keys (the window drops them, so
none counts twice) and one softmax normalises all, O(T * g).  A query at a global position
attends every key: :func:`_global_query_rows`, a dense pass over those g rows only, O(g * S),
whose result replaces theirs.  Causality, padding and a lazy additive bias (``bias.at`` on the
computed pairs) hold throughout; a query with no valid key gives 0 and finite gradients.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from xformer_bench.attention._ops.sparse import masked_attention
from xformer_bench.position import PairBias


def window_reach(window: int, causal: bool) -> tuple[int, int]:
    """Keys before and after a query for a window of ``window`` keys: the previous ``window``,
    self included, when causal; ``window // 2`` on each side otherwise."""
    if window < 1:
        raise ValueError(f"attention.window={window} must be >= 1")
    return (window - 1, 0) if causal else (window // 2, window // 2)


def band_block(span: int) -> int:
    """Queries per block for a band of ``span`` steps: the largest power of two up to the span,
    within [16, 128] -- a block's keys are ``block + span``, so a shorter block wastes fewer
    masked pairs, a longer one makes fewer, larger matrix products."""
    return max(16, min(128, 1 << (max(span, 1).bit_length() - 1)))


def _lanes(x: torch.Tensor, dilation: int, front: int, length: int) -> torch.Tensor:
    """(B, H, N, Dh) -> (B, H, d, length / d, Dh): ``front`` zero rows before, zeros up to
    ``length`` after, rows dealt into lanes by position modulo d (a view when d = 1)."""
    b, h, n, dh = x.shape
    if (front, length) != (0, n):
        x = F.pad(x, (0, 0, front, length - front - n))  # (B, H, length, Dh)
    return x.view(b, h, length // dilation, dilation, dh).transpose(2, 3)


def _join(a: torch.Tensor, b: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """``a`` and ``b`` side by side along ``dim`` (counted from the end), the others broadcast."""
    shape = list(torch.broadcast_shapes(a.shape[:dim] + (1,) + a.shape[dim:][1:],
                                        b.shape[:dim] + (1,) + b.shape[dim:][1:]))
    return torch.cat([x.expand(*shape[:dim], x.shape[dim], *shape[dim:][1:]) for x in (a, b)], dim)


@dataclass(frozen=True)
class _Blocks:
    """Where the blocks lie: T queries, the last of S positions, dealt into d lanes, cut into
    blocks of ``block`` lane steps, each with the keys from ``before`` steps before its first
    query to ``after`` steps after its last (``span`` in all).  ``aligned``: block n starts at
    lane step n * block (absolute); else at query 0's."""

    t: int
    s: int
    block: int
    before: int
    after: int
    d: int
    aligned: bool = False

    @property
    def offset(self) -> int:  # position of query 0
        return self.s - self.t

    @property
    def front(self) -> int:
        """Zero queries before query 0: the lanes start at 0 mod d, and aligned blocks at lane
        steps 0 mod ``block``."""
        return self.offset % (self.d * self.block if self.aligned else self.d)

    @property
    def q_len(self) -> int:  # queries in the lanes, a multiple of d
        return math.ceil((self.t + self.front) / self.d) * self.d

    @property
    def k_len(self) -> int:
        return math.ceil(self.s / self.d) * self.d

    @property
    def n_blocks(self) -> int:
        return math.ceil(self.q_len // self.d / self.block)

    @property
    def span(self) -> int:
        return self.block + self.before + self.after

    @property
    def start(self) -> int:  # lane step of block 0's first key
        return (self.offset - self.front) // self.d - self.before

    def queries(self, q: torch.Tensor) -> torch.Tensor:  # (B, H, T, Dh) -> (B, H, d, nb, block, Dh)
        x = _lanes(q, self.d, self.front, self.q_len)  # (B, H, d, q_len / d, Dh)
        if self.n_blocks * self.block > self.q_len // self.d:
            x = F.pad(x, (0, 0, 0, self.n_blocks * self.block - self.q_len // self.d))
        return x.reshape(*q.shape[:2], self.d, self.n_blocks, self.block, q.shape[-1])

    def windows(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, S, Dh) -> (B, H, d, nb, span, Dh)
        """Each block's keys, ``span`` consecutive rows of the zero-padded lanes."""
        pad_front = max(0, -self.start)
        pad_back = max(0, self.start + (self.n_blocks - 1) * self.block + self.span
                       - self.k_len // self.d)
        lanes = F.pad(_lanes(x, self.d, 0, self.k_len), (0, 0, pad_front, pad_back))
        index = _window_index(self.n_blocks, self.block, self.span, self.start + pad_front,
                              x.device)  # (nb * span,)
        return lanes.index_select(3, index).view(*lanes.shape[:3], self.n_blocks, self.span, -1)

    def unblock(self, out: torch.Tensor) -> torch.Tensor:  # (B, H, d, nb, block, Dh)
        b, h, dh = out.shape[0], out.shape[1], out.shape[-1]
        out = out.reshape(b, h, self.d, -1, dh)[:, :, :, : self.q_len // self.d]
        out = out.transpose(2, 3).reshape(b, h, self.q_len, dh)  # (B, H, q_len, Dh)
        return out[:, :, self.front: self.front + self.t]  # (B, H, T, Dh)


@functools.lru_cache(maxsize=8)
@torch.inference_mode(False)  # cached tensors are saved for backward: never inference tensors
def _window_index(n_blocks: int, block: int, span: int, first: int,
                  device: torch.device) -> torch.Tensor:  # (nb * span,)
    """Rows of each block's window in the padded lanes, block after block."""
    starts = first + torch.arange(n_blocks, device=device)[:, None] * block  # (nb, 1)
    return (starts + torch.arange(span, device=device)).flatten()


@functools.lru_cache(maxsize=8)
@torch.inference_mode(False)  # cached tensors are saved for backward: never inference tensors
def _pairs(layout: _Blocks, sliding: bool, causal: bool, n_global: int,
           device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query positions (d, nb, block, 1), key positions (d, nb, 1, span + g) -- each block's
    window, then the g global keys -- and which pairs count (d, nb, block | 1, span + g).
    A function of the shapes only: cached (a few layouts), so a training step builds none of it."""
    row = torch.arange(layout.block, device=device)[:, None]  # (block, 1)
    column = torch.arange(layout.span, device=device)  # (span,)
    lane = torch.arange(layout.d, device=device).view(layout.d, 1, 1, 1)
    block_start = torch.arange(layout.n_blocks, device=device).view(-1, 1, 1) * layout.block
    query_position = (layout.start + layout.before + block_start + row) * layout.d + lane
    key_position = (layout.start + block_start + column) * layout.d + lane  # (d, nb, 1, span)
    step = column - row - layout.before  # (block, span): key step - query step, same lane
    # the keys that exist, past the global keys (listed after the window); the band; causality
    valid = (key_position >= n_global) & (key_position < layout.s)  # (d, nb, 1, span)
    if sliding:
        valid = valid & (step >= -layout.before) & (step <= layout.after)  # (d, nb, block, span)
    if causal:
        valid = valid & (step <= 0)
    g = min(n_global, layout.s)
    if g:
        global_position = torch.arange(g, device=device).expand(layout.n_blocks, 1, g)
        global_valid = global_position <= query_position if causal else global_position >= 0
        key_position = _join(key_position, global_position)  # (d, nb, 1, span + g)
        valid = _join(valid, global_valid)
    return query_position, key_position, valid


@functools.lru_cache(maxsize=8)
@torch.inference_mode(False)  # cached tensors are saved for backward: never inference tensors
def _floor_mask(layout: _Blocks, sliding: bool, causal: bool, n_global: int,
                device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The additive mask of :func:`_pairs`: 0 where a pair counts, the lowest finite value
    (a row with no valid key stays finite) elsewhere; cached likewise."""
    valid = _pairs(layout, sliding, causal, n_global, device)[2]
    return torch.zeros(valid.shape, dtype=dtype, device=device).masked_fill(~valid, _floor(dtype))


def _floor(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min


def windowed_attention(
    q: torch.Tensor,  # (B, H, T, Dh)
    k: torch.Tensor,  # (B, H, S, Dh), S >= T: the queries are the last T positions
    v: torch.Tensor,  # (B, H, S, Dh)
    *,
    block: int,
    before: int,
    after: int,
    causal: bool,
    sliding: bool = True,
    dilation: int = 1,
    n_global: int = 0,
    extra_keys: torch.Tensor | None = None,  # (nb, m) key positions per block, -1 = none
    bias: PairBias | None = None,
    key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
) -> torch.Tensor:  # (B, H, T, Dh)
    """``extra_keys`` must lie outside the block's window and past the global keys (a key
    listed twice would count twice)."""
    if dilation < 1:
        raise ValueError(f"attention.dilation={dilation} must be >= 1")
    batch, heads, t, dh = q.shape
    s = k.shape[-2]
    layout = _Blocks(t, s, block, before, after, dilation, aligned=not sliding)
    query_position, key_position, valid = _pairs(layout, sliding, causal, n_global, q.device)
    keys, values = layout.windows(k), layout.windows(v)  # (B, H, d, nb, span, Dh)
    g = min(n_global, s)
    if g:  # the global keys, the same for every block: (B, H, 1, 1, g, Dh), broadcast
        keys = _join(keys, k[:, :, None, None, :g], dim=-2)  # (B, H, d, nb, span + g, Dh)
        values = _join(values, v[:, :, None, None, :g], dim=-2)
    if extra_keys is not None:  # listed per block, gathered: (B, H, 1, nb, m, Dh)
        extra_keys = extra_keys.to(q.device)[:, None, :]  # (nb, 1, m)
        index = extra_keys.clamp(min=0).flatten()
        shape = (batch, heads, 1, layout.n_blocks, extra_keys.shape[-1], dh)
        keys = _join(keys, k.index_select(2, index).view(shape), dim=-2)
        values = _join(values, v.index_select(2, index).view(shape), dim=-2)
        extra_valid = (extra_keys >= 0) & (extra_keys <= query_position if causal else True)
        key_position = _join(key_position, extra_keys.clamp(min=0))  # (d, nb, 1, keys)
        valid = _join(valid, extra_valid)
    key_index = key_position.clamp(0, s - 1)
    if key_padding_mask is not None:  # (B, 1, d, nb, block | 1, keys)
        valid = valid & ~key_padding_mask[:, key_index][:, None]
    if bias is None and extra_keys is None and key_padding_mask is None:
        additive = _floor_mask(layout, sliding, causal, n_global, q.device, q.dtype)
    elif bias is None:
        additive = torch.zeros(valid.shape, dtype=q.dtype, device=q.device)
        additive = additive.masked_fill(~valid, _floor(q.dtype))
    else:  # the bias of the computed pairs only: (H | B,H, d, nb, block, keys)
        query_index = (query_position - layout.offset).clamp(0, t - 1)
        additive = bias.at(query_index, key_index).to(q.dtype).masked_fill(~valid, _floor(q.dtype))
    out = _attend(layout.queries(q), keys, values, additive)  # (B, H, d, nb, block, Dh)
    if key_padding_mask is not None:  # the only way a query loses every key: zero it
        out = out * valid.any(-1, keepdim=True)
    out = layout.unblock(out)  # (B, H, T, Dh)
    rows = _global_query_rows(q, k, v, n_global, causal=causal, bias=bias,
                              key_padding_mask=key_padding_mask)
    return out if rows is None else torch.cat([rows, out[:, :, rows.shape[-2]:]], dim=2)


def _attend(
    queries: torch.Tensor,  # (B, H, d, nb, block, Dh)
    keys: torch.Tensor,  # (B, H, d, nb, keys, Dh)
    values: torch.Tensor,  # (B, H, d, nb, keys, Dh)
    additive: torch.Tensor,  # broadcastable to (B, H, d, nb, block, keys)
) -> torch.Tensor:  # (B, H, d, nb, block, Dh)
    """Softmax attention of each block over its keys, through ``scaled_dot_product_attention``
    (on CPU its fused kernel, which never holds the block's scores in memory) with the additive
    mask: blocks become heads, and batch and heads fold so that the mask broadcasts."""
    b, h, d, nb, block, dh = queries.shape
    additive = additive.reshape((1,) * (6 - additive.dim()) + additive.shape)
    rows, n_keys = additive.shape[-2:]  # rows: block, or 1 when every query of a block agrees
    if additive.shape[:2] == (1, 1):  # the same for every batch row and head
        shape, mask = (b * h, d * nb), additive.reshape(1, d * nb, rows, n_keys)
    else:
        shape = (b, h * d * nb)
        mask = additive.expand(-1, h, d, nb, rows, n_keys).reshape(-1, h * d * nb, rows, n_keys)
    out = F.scaled_dot_product_attention(queries.reshape(*shape, block, dh),
                                         keys.reshape(*shape, -1, dh),
                                         values.reshape(*shape, -1, dh), attn_mask=mask)
    return out.view(b, h, d, nb, block, dh)


def _global_query_rows(
    q: torch.Tensor,  # (B, H, T, Dh)
    k: torch.Tensor,  # (B, H, S, Dh)
    v: torch.Tensor,  # (B, H, S, Dh)
    n_global: int,
    *,
    causal: bool,
    bias: PairBias | None = None,
    key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
) -> torch.Tensor | None:  # (B, H, r, Dh) for the r queries at positions < n_global, or None
    """Queries at the global positions 0 .. n_global-1 attend every key (every earlier one when
    causal): dense attention over those rows only, O(n_global * S) -- O(n_global^2) when
    causal."""
    t, s = q.shape[-2], k.shape[-2]
    offset = s - t
    rows = max(0, min(t, n_global - offset))
    if rows == 0:
        return None
    if causal:  # the keys up to the last global query
        s = rows + offset
        k, v = k[:, :, :s], v[:, :, :s]
        key_padding_mask = None if key_padding_mask is None else key_padding_mask[:, :s]
    query_index = torch.arange(rows, device=q.device)[:, None]  # (r, 1)
    key_index = torch.arange(s, device=q.device)[None, :]  # (1, S)
    valid = key_index <= query_index + offset if causal else torch.ones(1, s, dtype=torch.bool,
                                                                         device=q.device)
    if key_padding_mask is not None:
        valid = valid & ~key_padding_mask[:, None, None, :]  # (B, 1, r, S)
    pair_bias = None if bias is None else bias.at(query_index, key_index)  # (H | B,H, r, S)
    out, _ = masked_attention(q[:, :, :rows], k, v, valid, pair_bias)
    return out
