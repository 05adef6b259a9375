"""``adaptive_input``: adaptive input representations (Baevski & Auli 2019, section 3).

The vocabulary is split into frequency clusters (:mod:`._clusters`); cluster i embeds its
tokens in d_i = D / k^i dimensions and projects them to D:

    x_t = W_i E_i[w_t - c_i]   for w_t in cluster i,   E_i: |V_i| x d_i,   W_i: d_i -> D,

so rare tokens get fewer parameters (section 3: k = 4, a projection for every cluster,
including the first whose d_0 = D).  Every cluster is evaluated on every position and the
right one selected (no data-dependent shapes, so no host synchronisation on a GPU); this
costs sum_i d_i D multiply-adds a position, at most 4/3 D^2 for k = 4.  A tied adaptive
softmax with the same cutoffs and factor shares the tables E_i (the paper's tied
embeddings; its projections are not tied here, a deviation from its best "tied projections"
model)."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.embedding import Embedding, init_projection, init_table
from xformer_bench.embedding._clusters import cluster_edges, cluster_widths
from xformer_bench.registry import EMBEDDING


class AdaptiveInput(Embedding):
    def __init__(self, vocab_size: int, d_model: int, cutoffs: list[float], factor: int):
        super().__init__()
        self.edges = cluster_edges(vocab_size, cutoffs, "embedding")
        self.widths = cluster_widths(d_model, len(self.edges) - 1, factor, "embedding")
        sizes = [b - a for a, b in zip(self.edges, self.edges[1:])]
        self.clusters = nn.ModuleList(init_table(nn.Embedding(n, w))
                                      for n, w in zip(sizes, self.widths))  # (|V_i|, d_i)
        self.projections = nn.ModuleList(init_projection(nn.Linear(w, d_model, bias=False))
                                         for w in self.widths)  # d_i -> D

    def tables(self) -> list[tuple[int, nn.Embedding]]:
        return list(zip(self.edges, self.clusters))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        out = None
        for start, end, table, project in zip(self.edges, self.edges[1:], self.clusters,
                                              self.projections):
            inside = (tokens >= start) & (tokens < end)  # (B, T)
            local = (tokens - start).clamp(0, end - start - 1)  # (B, T) ids within the cluster
            x = project(table(local)) * inside.unsqueeze(-1)  # (B, T, D), zero outside
            out = x if out is None else out + x
        return out


@EMBEDDING.register("adaptive_input")
def build(vocab_size: int, d_model: int, cutoffs: list[float], factor: int) -> AdaptiveInput:
    return AdaptiveInput(vocab_size, d_model, list(cutoffs), int(factor))
