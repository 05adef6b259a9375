"""``adaptive_softmax``: Grave et al. 2017 ("Efficient softmax approximation for GPUs"), an
output layer that spends less on rare words.

The vocabulary is split into frequency clusters (:mod:`xformer_bench.embedding._clusters`):
a head over the c_1 most frequent words plus one logit per tail cluster, and tail cluster i
(i = 1 .. n) over its words V_i.  With a tail's probability read from the head,

    p(w | h) = softmax(h H)_w                          for w in the head,
    p(w | h) = softmax(h H)_{c_1 + i} softmax(h P_i T_i)_w   for w in V_i,

where ``projection=true`` gives P_i: D -> d_i = D / k^i (the paper's dimension reduction of
the tail clusters, here k = ``factor`` = 4) and ``projection=false`` scores every tail at
width D (no P_i: Narang et al. 2021's "adaptive softmax without projection", only the computation is
clustered).  Parameters: D (c_1 + n) + sum_i (D d_i + d_i |V_i|) with projection,
D (c_1 + n) + D sum_i |V_i| = D (V + n) without.

The loss scores each target's head row and its own cluster only, on the positions whose
targets fall in it (:meth:`AdaptiveSoftmax.loss`): no (B, T, V) tensor; selecting those rows
synchronises with the host once per tail cluster on a GPU.  ``head(h)`` builds the whole
distribution exactly (sampling, decoding), as does a label-smoothed loss (smoothing spreads
mass over every word).  ``tie`` shares the output tables with the embedding's: with
``projection=false``, the rows of a single V x D table (``embedding=lookup``); with
``projection=true``, the cluster tables of ``embedding=adaptive_input`` of the same cutoffs
and factor (Baevski & Auli 2019's tied adaptive input and softmax; the tables only).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.embedding import Embedding
from xformer_bench.embedding._clusters import cluster_edges, cluster_widths
from xformer_bench.errors import ConfigError
from xformer_bench.heads import OutputHead, vocab_size
from xformer_bench.registry import HEAD


class AdaptiveSoftmax(OutputHead):
    def __init__(self, embedding: Embedding, d_model: int, tie: bool, cutoffs: list[float],
                 factor: int, projection: bool):
        super().__init__()
        self.edges = cluster_edges(vocab_size(embedding), cutoffs, "head")
        n_clusters = len(self.edges) - 1
        widths = (cluster_widths(d_model, n_clusters, factor, "head") if projection
                  else [d_model] * n_clusters)
        self.clusters = nn.Linear(d_model, n_clusters - 1, bias=False)  # H's tail rows
        self.projections = nn.ModuleList(
            nn.Linear(d_model, w, bias=False) if w != d_model else nn.Identity()
            for w in widths[1:])  # P_i
        tables = embedding.tables() if tie else []
        if tie and len(tables) == 1 and tables[0][1].embedding_dim == d_model and not projection:
            self.table, self.outputs = tables[0][1], None  # (V, D): a slice per cluster
            return
        self.table = None
        self.outputs = nn.ModuleList(nn.Linear(w, end - start, bias=False) for w, start, end
                                     in zip(widths, self.edges, self.edges[1:]))  # H's words, T_i
        if tie:
            if [s for s, _ in tables] != self.edges[:-1] or \
                    [t.embedding_dim for _, t in tables] != widths:
                raise ConfigError("head=adaptive_softmax head.tie=true shares the tables of "
                                  "embedding=lookup (head.projection=false) or of "
                                  "embedding=adaptive_input (the head's cutoffs and factor); "
                                  "choose another head or embedding, or set head.tie=false")
            for layer, (_, table) in zip(self.outputs, tables):
                layer.weight = table.weight

    def _output(self, i: int, x: torch.Tensor) -> torch.Tensor:  # (..., d_i) -> (..., |V_i|)
        if self.outputs is not None:
            return self.outputs[i](x)
        return F.linear(x, self.table.weight[self.edges[i]:self.edges[i + 1]])

    def _head(self, h: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., c_1 + n) logits
        return torch.cat([self._output(0, h), self.clusters(h)], dim=-1)

    def _tail(self, i: int, h: torch.Tensor) -> torch.Tensor:  # (..., D) -> (..., |V_i|) logits
        return self._output(i, self.projections[i - 1](h))

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, V) log-probs
        head = self._head(h).log_softmax(-1)  # (B, T, c_1 + n)
        c1 = self.edges[1]
        parts = [head[..., :c1]]
        for i in range(1, len(self.edges) - 1):
            parts.append(head[..., c1 + i - 1, None]
                         + self._tail(i, h).log_softmax(-1))  # (B, T, |V_i|)
        return torch.cat(parts, dim=-1)  # (B, T, V)

    def loss(self, h: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
             reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
        if label_smoothing:
            return super().loss(h, targets, ignore_index=ignore_index, reduction=reduction,
                                label_smoothing=label_smoothing)
        h, targets = h.flatten(0, -2), targets.flatten()  # (N, D), (N,)
        kept = targets != ignore_index  # (N,)
        ids = targets.where(kept, 0)
        edges = torch.tensor(self.edges[1:-1], device=ids.device)
        cluster = torch.bucketize(ids, edges, right=True)  # (N,) 0: head, i: tail i
        c1 = self.edges[1]
        head_target = torch.where(cluster == 0, ids, c1 + cluster - 1)  # (N,)
        head = self._head(h).float().log_softmax(-1)  # (N, c_1 + n)
        nll = -head.gather(1, head_target[:, None]).squeeze(1)  # (N,)
        for i in range(1, len(self.edges) - 1):
            rows = ((cluster == i) & kept).nonzero().squeeze(1)  # (N_i,)
            log_p = self._tail(i, h[rows]).float().log_softmax(-1)  # (N_i, |V_i|)
            local = ids[rows] - self.edges[i]
            nll = nll.index_add(0, rows, -log_p.gather(1, local[:, None]).squeeze(1))
        nll = nll * kept
        if reduction == "none":
            return nll
        return nll.sum() if reduction == "sum" else nll.sum() / kept.sum()


@HEAD.register("adaptive_softmax")
def build(embedding: Embedding, d_model: int, tie: bool, cutoffs: list[float], factor: int,
          projection: bool) -> AdaptiveSoftmax:
    return AdaptiveSoftmax(embedding, d_model, tie, list(cutoffs), int(factor), projection)
