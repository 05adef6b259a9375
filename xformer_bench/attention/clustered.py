"""Clustered attention (Vyas, Katharopoulos & Fleuret 2020, "Fast Transformers with Clustered
Attention", NeurIPS), plain or improved (i-clustered).

The queries of each sequence (per batch row and head) are grouped into C clusters S_1..S_C by
k-means on their hashes: ``bits`` random hyperplanes with offsets hash a query to a bit vector
(sign(w_b . q + c_b)), so that Hamming distance tracks Euclidean distance, and ``iterations``
Lloyd steps run in Hamming space -- centroids start at the first C hashes, each step assigns
every hash to its nearest centroid and sets each centroid bit to its members' majority (the
authors' ``fast_transformers.clustering.hamming``; an emptied cluster keeps its centroid where
theirs draws a random one).  Each cluster attends with its centroid, the mean of its queries,

    Q^c_j = (1/|S_j|) sum_{i in S_j} Q_i,    A^c = softmax(Q^c K^T / sqrt(Dh)),    V^c = A^c V,

and every query of S_j receives V^c_j.  Improved (``improved: true``, i-clustered): the centroid
picks its ``topk`` keys with the largest A^c_j, of total weight m_j = sum_{l in top_j} A^c_jl;
a query i of S_j attends exactly over those,

    A^t_il = m_j exp(q_i . k_l / sqrt(Dh)) / sum_{r in top_j} exp(q_i . k_r / sqrt(Dh)),  l in top_j
    A^t_il = A^c_jl,                                                                   otherwise.

Cost O(T (bits Dh + iterations C bits) + C S Dh + T topk Dh) per head; no T x T tensor (for
the exact part the queries are sorted by cluster into chunks, each gathering its cluster's top
keys once, as the authors' kernels sort them).  With at least as many clusters as queries
every query is its own cluster: exact attention.

Bidirectional only: the paper's centroid attends to every key, which a causal query may not
(so ``attention=clustered`` in the decoder LM is refused, one line).  Hyperplanes are drawn
afresh every training forward, as the authors do, from torch's generator; in eval they are
fixed per layer (a generator seeded with the layer index), so eval outputs are deterministic.
Defaults: C = 100 clusters (the paper's clustered-100 / i-clustered-100), 63 bits, 10 Lloyd
iterations and the top 32 keys (the paper's settings, the defaults of the authors' library),
improved -- i-clustered, the paper's closer approximation.  Not declared: ``additive_bias``
(a centroid has no position to bias by).

torch.compile: not one graph (k-means clusters of data-dependent sizes: the chunk count is read
on the host; tests/test_compile.py).
"""

from __future__ import annotations

import torch

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.clustering import chunk_by_cluster, cluster_sums, gather_rows, unchunk
from xformer_bench.attention._ops.sparse import masked_attention
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


def hamming_nearest(hashes: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Index of the nearest centroid (B, H, C, bits) to each hash (B, H, N, bits), bits in
    {0, 1}: Hamming distance |x| + |c| - 2 x.c, |x| left out (the same for every c)."""
    distance = centroids.sum(-1)[..., None, :] - 2 * hashes @ centroids.transpose(-1, -2)
    return distance.argmin(-1)  # (B, H, N); ties: the first centroid


def hamming_kmeans(hashes: torch.Tensor, n_clusters: int, iterations: int,
                   weight: torch.Tensor | None = None) -> torch.Tensor:  # (B, H, N) long
    """Lloyd's algorithm in Hamming space over hashes (B, H, N, bits) in {0, 1}, N >= C:
    ``iterations`` assignments, centroids recomputed between them by majority vote."""
    centroids = hashes[:, :, :n_clusters]  # (B, H, C, bits): the first C hashes
    for _ in range(iterations - 1):
        cluster = hamming_nearest(hashes, centroids)
        votes, count = cluster_sums(2 * hashes - 1, cluster, n_clusters, weight)  # +1 / -1 per bit
        centroids = torch.where(count[..., None] > 0, (votes > 0).to(hashes.dtype), centroids)
    return hamming_nearest(hashes, centroids)


@ATTENTION.register("clustered")
class ClusteredAttention(AttentionKernel):
    provides = frozenset({"bidirectional", "longer_keys", "key_padding_mask", "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, n_clusters: int = 100, bits: int = 63,
                 iterations: int = 10, improved: bool = True, topk: int = 32):
        super().__init__()
        if min(n_clusters, bits, iterations, topk) < 1:
            raise ConfigError(f"attention=clustered: n_clusters={n_clusters}, bits={bits}, "
                              f"iterations={iterations} and topk={topk} must be positive")
        self.n_clusters, self.bits, self.iterations = n_clusters, bits, iterations
        self.improved, self.topk = improved, topk

    def hash(self, q: torch.Tensor, layer: int) -> torch.Tensor:  # (B, H, T, Dh) -> (B, H, T, bits)
        dh = q.shape[-1]
        generator = None if self.training else torch.Generator().manual_seed(layer)
        planes = torch.randn(self.bits, dh + 1, generator=generator,
                             device="cpu" if generator is not None else q.device).to(q.device)
        projected = q.detach().float() @ planes[:, :dh].T + planes[:, dh]  # (B, H, T, bits)
        return (projected > 0).float()

    def cluster(self, q: torch.Tensor, layer: int = 0,
                weight: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
        """Each query's cluster (B, H, T) and the number of clusters."""
        b, h, t, _ = q.shape
        if self.n_clusters >= t:  # a cluster per query: the k-means optimum, exact attention
            return torch.arange(t, device=q.device).expand(b, h, t), t
        with torch.no_grad():
            return hamming_kmeans(self.hash(q, layer), self.n_clusters, self.iterations,
                                  weight), self.n_clusters

    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, S, Dh)
        v: torch.Tensor,  # (B, H, S, Dh)
        *,
        causal: bool,
        bias: PairBias | None = None,
        key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        if causal or bias is not None:
            raise ValueError("attention=clustered is bidirectional and takes no additive bias")
        t, s, dh = q.shape[-2], k.shape[-2], q.shape[-1]
        key_valid = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]
        query_weight = None if key_valid is None else key_valid[:, :, 0, s - t:]  # (B, 1, T)
        cluster, n_clusters = self.cluster(q, layer, query_weight)  # (B, H, T)
        if n_clusters == t:  # every query its own cluster
            centroids = q
        else:  # (B, H, C, Dh): the mean of its (unpadded) queries
            sums, count = cluster_sums(q, cluster, n_clusters, query_weight)
            centroids = sums / count.clamp(min=1)[..., None]
        scores = (centroids @ k.transpose(-1, -2)).float() * dh ** -0.5  # (B, H, C, S)
        if key_valid is not None:
            scores = scores.masked_fill(~key_valid, torch.finfo(torch.float32).min)
        attention = (scores - scores.logsumexp(-1, keepdim=True)).exp()  # A^c
        if key_valid is not None:
            attention = attention * key_valid  # a fully padded row: 0
        values = attention.to(v.dtype) @ v  # (B, H, C, Dh): V^c
        if not self.improved:
            return gather_rows(values, cluster)  # (B, H, T, Dh)
        top = scores.topk(min(self.topk, s), dim=-1).indices  # (B, H, C, k)
        top_attention = attention.gather(-1, top)  # (B, H, C, k)
        rest = values - (top_attention[..., None, :].to(v.dtype) @ gather_rows(v, top)).squeeze(-2)
        mass = top_attention.sum(-1).gather(-1, cluster)[..., None]  # (B, H, T, 1): m_j
        return mass.to(v.dtype) * self.exact_top(q, k, v, cluster, n_clusters, top,
                                                 key_padding_mask) + gather_rows(rest, cluster)

    @staticmethod
    def exact_top(q, k, v, cluster, n_clusters: int, top, key_padding_mask) -> torch.Tensor:
        """softmax(q_i K_top^T / sqrt(Dh)) V_top over the top keys of each query's cluster, the
        queries laid out in chunks of one cluster each (about T / C wide): O(T k Dh)."""
        t, s = q.shape[-2], k.shape[-2]
        layout, slot = chunk_by_cluster(cluster, n_clusters, -(-t // n_clusters))  # (B, H, G, w)
        chunk_cluster = cluster.gather(-1, layout[..., 0].clamp(min=0))  # (B, H, G)
        key_index = top.gather(2, chunk_cluster[..., None].expand(-1, -1, -1, top.shape[-1]))
        valid = torch.ones_like(key_index, dtype=torch.bool)  # (B, H, G, k)
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, :].expand(*key_index.shape[:2], s)
            valid = ~padded.gather(-1, key_index.flatten(2)).view(key_index.shape)
        queries = gather_rows(q, layout.clamp(min=0))  # (B, H, G, w, Dh)
        exact, _ = masked_attention(queries, gather_rows(k, key_index), gather_rows(v, key_index),
                                    valid[..., None, :])  # (B, H, G, w, Dh)
        return unchunk(exact, slot)  # (B, H, T, Dh)
