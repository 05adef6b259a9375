"""Routing attention (Roy, Saffar, Vaswani & Grangier 2021, "Efficient Content-Based Sparse
Attention with Routing Transformers", TACL 9), with local attention in the other heads as in
the paper's models.

Routing heads.  Queries and keys are layer-normalised without gain or bias (the authors' code;
the paper normalises them so that a small distance is a large dot product) and assigned, per
position, to the nearest of C centroids shared by queries and keys, mu(x) = argmax_c x . mu_c.
Query i attends to the keys of its own cluster (the paper's routing attention,
X_i = {j : mu(K_j) = mu(Q_i), j <= i} when causal), with the normalised q and k:
softmax(Q^ K^T / sqrt(Dh)).  The centroids are not trained by gradient: in training every
optimiser step moves them by an exponential moving average of the vectors assigned to them in
its forward passes, with decay lambda = 0.999 (the authors' hparams):

    mu_c <- lambda mu_c + (1 - lambda)/2 sum_{i: mu(Q_i)=c} Q^_i
                        + (1 - lambda)/2 sum_{j: mu(K_j)=c} K^_j,

kept, as in the authors' code, as a moving sum over a moving count (van den Oord et al. 2017's
codebook EMA), mu_c = sum_c / count_c, so that mu_c is a running mean of its members; the
count starts at 1 (mu_c at initialisation counts as one member) where the authors' starts at 0.
Statistics pool the batch and both queries and keys, per head and per layer: the centroids,
counts and sums are persistent buffers, state of the model (so ``model.share_blocks``, which
would pool every depth into one statistic, is refused), and stay fixed in eval.  The forward
only records the statistics; the EMA step runs after the optimiser step
(:mod:`xformer_bench.core.step_updates`; the authors' code steps inside the forward).  The
next forward sees the same centroids either way, but activation checkpointing's recomputation
then neither counts a batch twice nor sees moved centroids, and the micro-batches of one step
(gradient accumulation) pool into one EMA step.  Under DDP they follow rank 0 (DDP broadcasts
buffers) where the authors sum statistics over replicas.

Equal-size clusters, causally.  The paper balances clusters by letting each centroid take its
T/C nearest positions (top-k); whether a past position is among them depends on the future
ones, a causal leak.  Here each cluster's keys, in order of position, lie in blocks of
``window``, and a query attends the block of its cluster's keys that its position falls in and
the previous one (:func:`._clustering.sorted_cluster_attention`): O(T * window) per head; what
a query sees depends only on its position and the keys up to it, so decoding over cached keys
scores as the full pass.  A query sees at most 2 x ``window`` keys of its cluster, the nearest
in position (causal: before it; the paper: ``window`` = T/C keys, the nearest to the centroid).

Defaults: the authors' enwik8 setting (``enwik8_local_cluster8k``): half the heads local
(4 of 8), attention window 512 with C = T/512 clusters (16 at T = 8192; their wikitext-103,
PG-19 and translation settings also keep 512 per cluster), local blocks of 256 attending to
themselves and the previous block (bidirectional: half a block on either side, where the
authors' unmasked local attention takes a whole one).  The paper's analysis takes
C ~ sqrt(T) (O(T^1.5 d)); its released settings fix the cluster size instead: linear in T,
with a reach of 2 x 512 keys a query (``keys_per_query``) that only pays off well beyond it
(the allocation test holds routing to T^2 / 8 a plane at 16 x 1024 = 16384; ``window: 128``
and ``local_window: 128`` at T = 2048-4096).
Left out: the commitment loss of weight 1e-4 on q and k (the kernel interface carries no
auxiliary loss), the authors' option to skip routing in the first layers, relative positions
inside clusters (``additive_bias`` is not declared: the pairs differ per batch row and head).

torch.compile: not one graph (k-means clusters of data-dependent sizes (as clustered);
tests/test_compile.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.clustering import cluster_sums, sorted_cluster_attention
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.step_updates import recomputing
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


def local_attention(q, k, v, block: int, *, causal: bool, key_padding_mask=None) -> torch.Tensor:
    """Blocks of ``block`` positions (at absolute positions), each attending to the 2 x
    ``block`` keys from the previous block's start (causal; the authors' local heads,
    query_shape = memory_flange) or centred on it: routing attention with a single cluster."""
    def one_cluster(x: torch.Tensor) -> torch.Tensor:  # (B, H, N, Dh) -> (B, H, N) zeros
        return torch.zeros(x.shape[:-1], dtype=torch.long, device=x.device)

    return sorted_cluster_attention(q, k, v, one_cluster(q), one_cluster(k), 1, block,
                                    causal=causal, key_padding_mask=key_padding_mask)


@ATTENTION.register("routing")
class RoutingAttention(AttentionKernel):
    provides = frozenset({"causal", "bidirectional", "longer_keys", "key_padding_mask",
                          "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, n_clusters: int | None = None, window: int = 512,
                 local_fraction: float = 0.5, local_window: int = 256, decay: float = 0.999):
        super().__init__()
        if window < 1 or local_window < 1 or (n_clusters is not None and n_clusters < 1):
            raise ConfigError(f"attention=routing: window={window}, local_window={local_window} "
                              f"and n_clusters={n_clusters} must be positive")
        if not 0 <= local_fraction <= 1 or not 0 <= decay < 1:
            raise ConfigError(f"attention=routing: local_fraction={local_fraction} must be in "
                              f"[0, 1] and decay={decay} in [0, 1)")
        self.local_heads = int(dims.n_heads * local_fraction)
        routing_heads = dims.n_heads - self.local_heads
        self.n_clusters = n_clusters or math.ceil(dims.seq_len / window)
        self.window, self.local_window, self.decay = window, local_window, decay
        self.keys_per_query = 2 * max(window if routing_heads else 0,
                                      local_window if self.local_heads else 0)
        """The most keys a query scores, a constant (its block and the previous one): the cost
        is O(T x this), a quarter of the keys at T = 4096 with the default 512."""
        shape = (routing_heads, self.n_clusters, dims.head_dim)
        centroids = F.layer_norm(torch.randn(shape), shape[-1:])  # (Hr, C, Dh), the authors' init
        self.register_buffer("centroids", centroids)
        self.register_buffer("ema_sum", centroids.clone())  # (Hr, C, Dh)
        self.register_buffer("ema_count", torch.ones(shape[:2]))  # (Hr, C)
        self.pending: tuple[torch.Tensor, torch.Tensor] | None = None
        """Sums (Hr, C, Dh) and counts (Hr, C) recorded since the last EMA step."""

    def nearest(self, x: torch.Tensor) -> torch.Tensor:  # (B, Hr, N, Dh) -> (B, Hr, N) long
        with torch.no_grad():
            return torch.einsum("bhnd,hcd->bhnc", x, self.centroids.to(x.dtype)).argmax(-1)

    @torch.no_grad()
    def record_statistics(self, q, query_cluster, k, key_cluster, query_weight, key_weight):
        """Add this batch's normalised queries and keys, summed per cluster, to ``pending``
        -- not in checkpointing's recomputation, which replays a recorded forward."""
        if recomputing():
            return
        sums, counts = ((a + b).sum(0) for a, b in zip(
            cluster_sums(q.float(), query_cluster, self.n_clusters, query_weight),
            cluster_sums(k.float(), key_cluster, self.n_clusters, key_weight)))
        if self.pending is not None:
            sums, counts = sums + self.pending[0], counts + self.pending[1]
        self.pending = sums, counts  # (Hr, C, Dh), (Hr, C)

    @torch.no_grad()
    def apply_pending_updates(self) -> None:
        """One EMA step with the statistics recorded since the last: called after each
        optimiser step (:mod:`xformer_bench.core.step_updates`)."""
        if self.pending is None:
            return
        (sums, counts), self.pending = self.pending, None
        share = (1 - self.decay) / 2  # (1 - lambda)/2 each for queries and keys
        self.ema_sum.mul_(self.decay).add_(share * sums)  # (Hr, C, Dh)
        self.ema_count.mul_(self.decay).add_(share * counts)  # (Hr, C)
        alive = self.ema_count > 1e-20  # a long-empty cluster keeps its centroid
        mean = self.ema_sum / self.ema_count.clamp(min=1e-20)[..., None]
        self.centroids.copy_(torch.where(alive[..., None], mean, self.centroids))

    def route(self, q, k, v, *, causal: bool, key_padding_mask=None) -> torch.Tensor:
        t, s = q.shape[-2], k.shape[-2]
        q, k = F.layer_norm(q, q.shape[-1:]), F.layer_norm(k, k.shape[-1:])  # (B, Hr, T|S, Dh)
        query_cluster, key_cluster = self.nearest(q), self.nearest(k)  # (B, Hr, T), (B, Hr, S)
        if self.training:
            key_weight = None if key_padding_mask is None else ~key_padding_mask[:, None, :]
            query_weight = None if key_weight is None else key_weight[..., s - t:]
            self.record_statistics(q, query_cluster, k, key_cluster, query_weight, key_weight)
        return sorted_cluster_attention(q, k, v, query_cluster, key_cluster, self.n_clusters,
                                        self.window, causal=causal,
                                        key_padding_mask=key_padding_mask)

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
        if bias is not None:
            raise ValueError("attention=routing takes no additive bias (it declares none)")
        n = self.local_heads
        heads = []
        if n:
            heads.append(local_attention(q[:, :n], k[:, :n], v[:, :n], self.local_window,
                                         causal=causal, key_padding_mask=key_padding_mask))
        if n < q.shape[1]:
            heads.append(self.route(q[:, n:], k[:, n:], v[:, n:], causal=causal,
                                    key_padding_mask=key_padding_mask))
        return torch.cat(heads, dim=1)  # (B, H, T, Dh)
