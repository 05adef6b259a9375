"""Learned relative position representations (Shaw, Uszkoreit & Vaswani 2018).

The logit of query ``i`` and key ``j`` gains ``q_i . a_{clip(j - i, k)}`` where ``a`` is a
learned table of ``2k + 1`` vectors of size ``Dh``, shared by the heads, one per layer
(``shared_across_layers`` lets all layers share one).  Distances beyond ``k`` share the
edge vectors.  Only the key-side term ``a^K`` is used: it is an additive logit bias, so
the fused attention kernel still applies; the value-side term ``a^V`` would need a
kernel of its own, and Shaw et al.'s ablation finds ``a^K`` alone as good as both.
"""

from __future__ import annotations

import math

import torch

from xformer_bench.core.dims import ModelDims
from xformer_bench.position import LayerwiseTable, PairBias, Position
from xformer_bench.registry import POSITION


@POSITION.register("relative")
class RelativePosition(Position):
    requires = {"attention": frozenset({"additive_bias"})}

    def __init__(
        self,
        dims: ModelDims,
        clip_distance: int = 16,
        shared_across_layers: bool = False,
        init_std: float = 0.02,
    ):
        super().__init__()
        if clip_distance < 1:
            raise ValueError(f"position.clip_distance={clip_distance} must be >= 1")
        self.clip_distance = clip_distance
        self.scale = 1.0 / math.sqrt(dims.head_dim)  # the same 1/sqrt(Dh) as q k^T
        self.tables = LayerwiseTable(
            dims.n_layers, shared_across_layers, (2 * clip_distance + 1, dims.head_dim), init_std
        )  # per layer: (2k+1, Dh)

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,
    ) -> PairBias:
        if query is None:
            raise ValueError("the 'relative' position bias depends on the queries: pass query=")
        table = self.tables(layer).to(query.dtype)  # (2k+1, Dh)
        per_distance = query @ table.T * self.scale  # (B, H, Tq, 2k+1): O(T k), never T x T
        k = self.clip_distance

        def at(query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:  # (B, H, *S)
            row = bias.distance(query_index, key_index).clamp(-k, k) + k  # S
            return per_distance[:, :, query_index.expand_as(row), row]

        bias = PairBias(t_query, t_key, query.device, at)
        return bias
