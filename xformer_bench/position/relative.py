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

from xformer_bench.models.dims import ModelDims
from xformer_bench.position import LayerwiseTable, Position, relative_distance
from xformer_bench.registry import POSITION


@POSITION.register("relative")
class RelativePosition(Position):
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

    def table_index(self, t_query: int, t_key: int, device: torch.device) -> torch.Tensor:
        """Row of the table for each (query, key) pair: clip(j - i, k) + k, (Tq, Tk)."""
        k = self.clip_distance
        return relative_distance(t_query, t_key, device).clamp(-k, k) + k  # (Tq, Tk)

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if query is None:
            raise ValueError("the 'relative' position bias depends on the queries: pass query=")
        b, h, tq, _ = query.shape  # (B, H, Tq, Dh)
        table = self.tables(layer).to(query.dtype)  # (2k+1, Dh)
        per_distance = query @ table.T  # (B, H, Tq, 2k+1)
        index = self.table_index(tq, t_key, query.device)  # (Tq, Tk)
        logits = per_distance.gather(-1, index.expand(b, h, tq, t_key))  # (B, H, Tq, Tk)
        return logits * self.scale
