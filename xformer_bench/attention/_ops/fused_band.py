"""Causal banded attention on CPU as fused kernel calls merged by log-sum-exp
(:mod:`.key_set_union`): ``local`` (the previous w positions), ``dilated`` (the same in each of d
lanes), ``block_local`` (blocks of l positions with a memory of m before them) and
``longformer`` (the window and its g global keys, undilated).

Each lane (positions r, r + d, ...) is laid out as rows of W positions.  A query's row attends
itself causally (one call over all rows, folded into groups), and row n attends row n - b, for
b = 1 .. ceil(reach / W), in calls of a quarter of the rows each (so the gradients the
kernel's backward returns before they are summed are small), with a (W, W) pattern when
part of that row is out of reach: key column c' is in reach of query column c when
c' >= c + b W - reach (sliding) or c' >= b W - memory (blocked: the whole block sees its
memory).  W is half the window (local, dilated, longformer: measured fastest among w, w / 2,
w / 4 and w / 8 on CPU at T = 4096) or the block (block_local, bigbird).  Global keys are one
more call for the queries past the window's reach of them.  Only pairs near the
band are scored (W^2 per row and call), nothing is copied, and nothing is stored but the output
and its normaliser: the step holds full attention's memory without recomputing anything (the
windowed path, :mod:`.window`, recomputes its gathered keys, :mod:`.recompute`).  A bias, key
padding, bidirectional attention, keys longer than the queries and non-CPU tensors take that
path (:func:`.key_set_union.fused_applies`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from xformer_bench.attention._ops.key_set_union import KeyCall, Span, fused_applies, on_grid


def piece_rows(lane_rows: int) -> int:
    """Rows per call of the earlier-row calls: a quarter of the lane."""
    return max(1, math.ceil(lane_rows / 4))


@dataclass(frozen=True)
class Band:
    width: int  # W, the row length (a query block when blocked)
    reach: int  # how many positions back a query (sliding) or a block's first query sees
    sliding: bool = True
    dilation: int = 1
    n_global: int = 0  # keys 0 .. g - 1 seen by every later query (Longformer, BigBird; d = 1)
    random: tuple[tuple[int, ...], ...] = ()  # per row, more rows it sees (BigBird's; -1: none)

    def in_reach(self, back: int) -> torch.Tensor | None:
        """(W, W) bool: query column c, key column c' of the row ``back`` rows earlier; None:
        every pair."""
        first = back * self.width - self.reach  # the first key column query column 0 sees
        if first + (self.width - 1 if self.sliding else 0) <= 0:
            return None
        c = torch.arange(self.width)
        return (c >= first + (c[:, None] if self.sliding else 0)).expand(self.width, self.width)

    @functools.lru_cache(maxsize=64)
    def calls(self, lane_rows: int) -> tuple[KeyCall, ...]:
        w, d = self.width, self.dilation

        def rows(lane: int, first: int, stop: int) -> Span:  # rows [first, stop) of a lane
            return Span(lane + d * first * w, lane + d * stop * w, groups=stop - first, step=d)

        calls = []
        for lane in range(d):
            calls.append(KeyCall(0, rows(lane, 0, lane_rows), rows(lane, 0, lane_rows),
                                 causal=True))
            for back in range(1, min(lane_rows - 1, math.ceil(self.reach / w)) + 1):
                for first in range(back, lane_rows, piece_rows(lane_rows)):  # in pieces
                    stop = min(first + piece_rows(lane_rows), lane_rows)
                    calls.append(KeyCall(back, rows(lane, first, stop),
                                         rows(lane, first - back, stop - back),
                                         allowed=self.in_reach(back)))
        calls += self.global_calls(lane_rows * w, 1 + max(c.slot for c in calls))
        slot = 1 + max(c.slot for c in calls)
        return tuple(calls) + tuple(  # each random row its own slot: a row sees several
            KeyCall(slot + nth, Span(row * w, (row + 1) * w), Span(key * w, (key + 1) * w))
            for row, keys in enumerate(self.random) for nth, key in enumerate(keys) if key >= 0)

    def first_in_reach(self, i: torch.Tensor) -> torch.Tensor:
        """The first key position the window holds for query position i."""
        return (i if self.sliding else i // self.width * self.width) - self.reach

    def first_query_reaching_past(self, j: int) -> int:
        """The first query position whose window starts after key position j."""
        if self.sliding:
            return j + 1 + self.reach
        return (j + self.reach) // self.width * self.width + self.width

    def global_calls(self, n: int, slot: int) -> tuple[KeyCall, ...]:
        """The global keys 0 .. g - 1 for the queries beyond the window's reach of them: with a
        (queries, g) pattern where the window still holds some of them."""
        g = min(self.n_global, n)
        if not g:
            return ()
        near = self.first_query_reaching_past(0)  # before it the window holds every key <= i
        clear = self.first_query_reaching_past(g - 1)  # from it on, no global key is in it
        near, clear = min(near, n), min(clear, n)
        calls = []
        if near < clear:
            i, j = torch.arange(near, clear)[:, None], torch.arange(g)
            calls.append(KeyCall(slot, Span(near, clear), Span(0, g),
                                 allowed=j < self.first_in_reach(i)))
        if clear < n:
            calls.append(KeyCall(slot, Span(clear, n), Span(0, g)))
        return tuple(calls)


def fused_band(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, band: Band) -> torch.Tensor:
    """Causal attention of q, k, v (B, H, T, D) within ``band``."""
    s, d = k.shape[-2], band.dilation
    lane_rows = math.ceil(s / (d * band.width))
    calls = band.calls(lane_rows)
    return on_grid(q, k, v, lane_rows * band.width * d, lambda k_, v_: (calls, ()))


def fused_band_on_cpu(forward):
    """Wraps a banded kernel's ``forward``: :func:`fused_band` with ``kernel.band(S, layer)``
    where :func:`fused_applies` and that is not None; the wrapped (windowed) forward otherwise."""

    @functools.wraps(forward)
    def kernel(self, q, k, v, *, causal, bias=None, key_padding_mask=None, layer=0):
        if fused_applies(self, q, k, causal, bias, key_padding_mask):
            shape = self.band(k.shape[-2], layer)  # None: this setting has no fused path
            if shape is not None:
                return fused_band(q, k, v, shape)
        return forward(self, q, k, v, causal=causal, bias=bias,
                       key_padding_mask=key_padding_mask, layer=layer)

    return kernel


__all__ = ["Band", "fused_band", "fused_band_on_cpu"]
