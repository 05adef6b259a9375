"""Sort, chunk, look one chunk back, un-sort: the plumbing of attention over a content-based
order (Reformer's LSH buckets; any kernel that groups positions by a key and attends within
groups of consecutive sorted items).

Items of a (B, H, T, ...) tensor are sorted by an integer key per (batch, head, round); the
sorted sequence is cut into n chunks of ``chunk`` items, and each chunk attends to itself and
the chunk before it -- ``2 * chunk`` keys per query, so memory is O(T * chunk), never T x T.
Tensors are laid out *chunk-major*, (n, B, H, R, chunk, ...), gathered straight from the
unsorted rows (:func:`chunk_rows`), so that any run of chunks is contiguous: a kernel attends
to them a run at a time (:func:`windows`), which keeps the working set in the CPU cache.
:func:`unchunk` brings results back to the original order.
"""

from __future__ import annotations

import torch

def sort_by(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``order`` (the original index of each sorted item) and ``undo`` (the sorted index of
    each original item) of ``key`` (..., T) along its last dim; keys should be distinct."""
    order = key.argsort(dim=-1)  # (..., T)
    ticker = torch.arange(key.shape[-1], device=key.device).expand_as(order)
    undo = torch.empty_like(order).scatter_(-1, order, ticker)  # (..., T)
    return order, undo


def chunk_rows(order: torch.Tensor, chunk: int) -> torch.Tensor:
    """Rows, in a (B, H, T) source flattened to B*H*T rows, of the sorted items ``order``
    (B, H, R, T) gives, chunk-major: (n, B, H, R, chunk)."""
    b, h, r, t = order.shape
    offset = torch.arange(b * h, device=order.device).view(b, h, 1, 1) * t  # (B, H, 1, 1)
    return (order + offset).view(b, h, r, t // chunk, chunk).permute(3, 0, 1, 2, 4)


def windows(x: torch.Tensor, per_piece: int, fill: float | bool | int = 0) -> list[torch.Tensor]:
    """Chunk-major ``x`` (n, B, H, R, chunk, *rest) in runs of ``per_piece`` chunks, each chunk
    after the one before it: [(G, B, H, R, 2*chunk, *rest)].  The first chunk has none before
    it: ``fill`` (Reformer's code wraps around to the last chunk).  Built run by run, so the
    doubled keys exist only a run at a time between reading and use."""
    runs = x.split(per_piece)
    out = []
    for i, run in enumerate(runs):
        last = runs[i - 1][-1:] if i else torch.full_like(run[:1], fill)  # (1, ..., chunk, ...)
        previous = torch.cat((last, run[:-1]))  # (G, B, H, R, chunk, *rest)
        out.append(torch.cat((previous, run), dim=4))
    return out


def unchunk(x: torch.Tensor, undo: torch.Tensor) -> torch.Tensor:
    """Chunk-major ``x`` (n, B, H, R, chunk, *rest) in the original order of ``undo``
    (B, H, R, T), which gives each item's sorted index: (B, H, R, T, *rest)."""
    n, b, h, r, chunk = x.shape[:5]
    s = undo  # (B, H, R, T)
    lead = torch.arange(b * h * r, device=undo.device).view(b, h, r, 1)  # (b, h, r) as one
    flat = ((s // chunk) * (b * h * r) + lead) * chunk + s % chunk  # (B, H, R, T)
    return take(x.reshape(n * b * h * r * chunk, *x.shape[5:]), flat)


def take(rows: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``rows[index]`` for ``rows`` (N, *rest) and any long ``index`` through index_select,
    whose backward is a fast index_add (advanced indexing's is a slow accumulate on CPU)."""
    return rows.index_select(0, index.reshape(-1)).view(*index.shape, *rows.shape[1:])
