"""Attention among positions grouped by cluster: the engine of ``routing`` and ``clustered``.

Every grouping here is per sequence: each (batch row, head) clusters its own positions, so
rows never influence each other.  Helpers:

* :func:`gather_rows` -- rows of a (B, H, N, D) tensor at per-(batch, head) indices;
* :func:`cluster_sums` -- per-cluster sums and counts of a row's vectors (centroids, EMA);
* :func:`chunk_by_cluster` / :func:`unchunk` -- positions sorted by cluster, then position,
  into equal chunks of one cluster each, and back;
* :func:`sorted_cluster_attention` -- each query attends to keys of its own cluster near it,
  one batched (chunks, w, 2w) attention: O(T * w) per head, never T x T.

Sorted blocks are how clusters stay equal-sized here without Roy et al.'s (2021) top-k
balancing, where each centroid takes its T / C nearest positions: whether a past position
belongs to a cluster then depends on how near the *future* positions are, a causal leak (their
decoder blanks the future at generation time; training does not).  Here membership is each
position's own nearest centroid and blocks are counted over a cluster's keys in order of
position, so what a query sees is fixed by its position and the keys up to it -- also when
those keys come from a decoding cache.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def gather_rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (B, H, N, D) at ``index`` (B, H, *shape), per (batch, head):
    (B, H, *shape, D)."""
    b, h, _, d = x.shape
    flat = index.reshape(b, h, -1, 1).expand(-1, -1, -1, d)  # (B, H, M, D), a view
    return x.gather(2, flat).view(*index.shape, d)


def cluster_sums(
    x: torch.Tensor,  # (B, H, N, D)
    cluster: torch.Tensor,  # (B, H, N) long in [0, n_clusters)
    n_clusters: int,
    weight: torch.Tensor | None = None,  # (B, 1 | H, N): 0 leaves a position out
) -> tuple[torch.Tensor, torch.Tensor]:  # sums (B, H, C, D), counts (B, H, C)
    b, h, n, d = x.shape
    w = x.new_ones(b, h, n) if weight is None else weight.to(x.dtype).expand(b, h, n)
    sums = x.new_zeros(b, h, n_clusters, d).scatter_add(
        2, cluster[..., None].expand(-1, -1, -1, d), x * w[..., None])
    counts = w.new_zeros(b, h, n_clusters).scatter_add(2, cluster, w)
    return sums, counts


def _counts(cluster: torch.Tensor, n_clusters: int) -> torch.Tensor:  # (B, H, N) -> (B, H, C) long
    return torch.zeros(*cluster.shape[:2], n_clusters, dtype=torch.long,
                       device=cluster.device).scatter_add_(2, cluster, torch.ones_like(cluster))


def chunk_by_cluster(cluster: torch.Tensor, n_clusters: int, chunk: int,
                     known_chunks: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Lay the positions of each row out by cluster, in order of position within a cluster,
    in chunks of w = min(chunk, N) that hold one cluster each (its last one padded).

    ``cluster`` (B, H, N) -> ``layout`` (B, H, G, w), the position in each slot (-1: padding),
    and ``slot`` (B, H, N), each position's slot in the flattened layout; G <= (N + C (w - 1)) / w.
    A position's chunk and slot depend only on the positions of its cluster before it.  Any
    grouping serves as ``cluster`` (:func:`sorted_cluster_attention` passes cluster and block).
    G, the most chunks any row needs, depends on the clusters' sizes: it is read from the
    device (on a GPU the host waits) unless the caller knows it from the shapes alone
    (``known_chunks``: a grouping fixed by position, as one cluster's blocks).
    """
    b, h, n = cluster.shape
    w = min(chunk, n)
    position = torch.arange(n, device=cluster.device)
    order = (cluster * n + position).argsort(dim=-1)  # (B, H, N) sorted -> position
    cluster_sorted = cluster.gather(-1, order)  # (B, H, N)
    count = _counts(cluster, n_clusters)  # (B, H, C)
    rank = position - (count.cumsum(-1) - count).gather(-1, cluster_sorted)  # rank in cluster
    n_chunks = (count + w - 1) // w  # (B, H, C)
    chunk_id = (n_chunks.cumsum(-1) - n_chunks).gather(-1, cluster_sorted) + rank // w
    slot_sorted = chunk_id * w + rank % w  # (B, H, N)
    g = int(n_chunks.sum(-1).max()) if known_chunks is None else known_chunks
    layout = torch.full((b, h, g * w), -1, dtype=torch.long, device=cluster.device)
    layout = layout.scatter(-1, slot_sorted, order).view(b, h, g, w)
    return layout, torch.empty_like(order).scatter_(-1, order, slot_sorted)


def one_cluster_chunks(t: int, s: int, chunk: int) -> int:
    """G of :func:`chunk_by_cluster` for the T queries of :func:`sorted_cluster_attention` with
    a single cluster (routing's local heads), from the shapes alone: query i (position
    s - t + i) falls in block (s - t + i) // chunk, and each block's queries fill
    ceil(count / w) chunks of w = min(chunk, T)."""
    w = min(chunk, t)
    return sum(-(-(min(s, (b + 1) * chunk) - max(s - t, b * chunk)) // w)
               for b in range((s - t) // chunk, (s - 1) // chunk + 1))


def unchunk(x: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (B, H, G, w, D) back in order of position: (B, H, N, D)."""
    return gather_rows(x.flatten(2, 3), slot)


def sorted_cluster_attention(
    q: torch.Tensor,  # (B, H, T, Dh)
    k: torch.Tensor,  # (B, H, S, Dh), S >= T: the queries are the last T positions
    v: torch.Tensor,  # (B, H, S, Dh)
    query_cluster: torch.Tensor,  # (B, H, T) long
    key_cluster: torch.Tensor,  # (B, H, S) long
    n_clusters: int,
    chunk: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
) -> torch.Tensor:  # (B, H, T, Dh)
    """Each query attends to keys of its own cluster, near it in the cluster's order.

    A cluster's keys, in order of position, lie in blocks of ``chunk`` (block n: its keys
    ranked n x chunk ..); a query at position p falls in the block of a, the count of its
    cluster's keys before p.  It sees 2r keys of its cluster (r = min(chunk, S)): causal, its
    block and the previous one, keeping those at or before p; bidirectional, 2r centred on its
    block's start, kept inside the cluster (all of them if it has <= 2r).  So a query's window
    is fixed by its absolute position and the keys up to it (causal): the T queries of a
    decode step over cached keys see what the full pass's do.  One cluster: blocks of
    ``chunk`` positions attending to themselves and the previous block; with chunk >= S, full
    attention.  The queries of a (cluster, block), in order of position, share its window in
    chunks of w = min(chunk, T): at most T / w + S / chunk + C chunks, so the scores hold at
    most 2r (T + S + C w) entries per head; softmax by ``scaled_dot_product_attention`` under
    that mask.
    """
    b, h, t, dh = q.shape
    s = k.shape[-2]
    device = q.device
    # -- keys: sorted by (cluster, position); cluster c's are the sorted [lo_c, hi_c) --
    code_sorted, key_order = (key_cluster * s + torch.arange(s, device=device)).sort(dim=-1)
    key_count = _counts(key_cluster, n_clusters)  # (B, H, C)
    first_key = key_count.cumsum(-1) - key_count  # (B, H, C): lo_c
    # -- queries: the block of the rank each one's position takes among its cluster's keys --
    code = query_cluster * s + torch.arange(s - t, s, device=device)  # (B, H, T)
    block = (torch.searchsorted(code_sorted, code)
             - first_key.gather(-1, query_cluster)) // chunk  # (B, H, T)
    n_blocks = -(-s // chunk)
    layout, slot = chunk_by_cluster(query_cluster * n_blocks + block, n_clusters * n_blocks,
                                    chunk, one_cluster_chunks(t, s, chunk) if n_clusters == 1
                                    else None)  # (B, H, G, w), (B, H, T)
    g, w = layout.shape[-2:]
    member = layout[..., 0].clamp(min=0)  # (B, H, G): a query of each chunk
    chunk_cluster = query_cluster.gather(-1, member)  # (B, H, G)
    lo = first_key.gather(-1, chunk_cluster)
    hi = lo + key_count.gather(-1, chunk_cluster)
    anchor = lo + block.gather(-1, member) * chunk  # (B, H, G): the block's first key, sorted
    reach = min(chunk, s)  # the window: 2 x reach keys
    if causal:  # the previous block and this one: ranks up to the query's, no later count
        start = (anchor - reach).maximum(lo)
    else:  # centred on the block's start, kept inside the cluster where it is smaller
        start = (anchor - reach // 2).minimum(hi - 2 * reach).maximum(lo)
    index = start[..., None] + torch.arange(2 * reach, device=device)  # (B, H, G, 2 reach)
    in_cluster = index < hi[..., None]
    key_position = key_order.gather(-1, index.clamp(max=s - 1).flatten(2)).view(index.shape)
    # -- attention within each chunk --
    valid = in_cluster[..., None, :] & (layout >= 0)[..., None]  # (B, H, G, w, 2 reach)
    if causal:
        valid = valid & (key_position[..., None, :] <= layout[..., None] + (s - t))
    if key_padding_mask is not None:
        padded = key_padding_mask[:, None, :].expand(b, h, s).gather(-1, key_position.flatten(2))
        valid = valid & ~padded.view(index.shape)[..., None, :]
    seen = valid.any(-1, keepdim=True)  # (B, H, G, w, 1): a query with no key gives 0
    valid = valid | (~seen & (torch.arange(2 * reach, device=device) == 0))  # no empty row
    queries = gather_rows(q, layout.clamp(min=0)).flatten(1, 2)  # (B, H * G, w, Dh): 4-D,
    keys = gather_rows(k, key_position).flatten(1, 2)  # (B, H * G, 2 reach, Dh): fused kernels
    values = gather_rows(v, key_position).flatten(1, 2)
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=valid.flatten(1, 2))
    return unchunk(out.view(b, h, g, w, dh) * seen, slot)  # (B, H, T, Dh)
