"""Bucketed relative position bias of T5 (Raffel et al. 2020).

Each head learns one scalar per bucket of relative distance, added to the attention logits.
Half of the buckets hold the distances 0, 1, ... exactly; the other half cover the
distances up to ``max_distance`` on a log scale; longer distances share the last bucket.
A causal LM looks only back (``bidirectional: false``); an encoder splits the buckets
between the two directions.  T5 shares one table across layers (the baseline of Narang
et al. 2021); ``shared_across_layers: false`` gives each layer its own.
"""

from __future__ import annotations

import math

import torch

from xformer_bench.models.dims import ModelDims
from xformer_bench.position import LayerwiseTable, Position, relative_distance
from xformer_bench.registry import POSITION


def relative_position_bucket(
    distance: torch.Tensor,  # j - i, long, any shape
    bidirectional: bool,
    num_buckets: int,
    max_distance: int,
) -> torch.Tensor:  # bucket ids in [0, num_buckets), same shape
    if bidirectional:
        num_buckets //= 2
        direction_offset = (distance > 0).long() * num_buckets  # keys ahead use the upper half
        n = distance.abs()
    else:
        direction_offset = torch.zeros_like(distance)
        n = (-distance).clamp(min=0)  # keys ahead (masked anyway) fall into bucket 0
    max_exact = num_buckets // 2
    log_fraction = torch.log(n.clamp(min=max_exact).double() / max_exact) / math.log(
        max_distance / max_exact
    )
    log_bucket = max_exact + (log_fraction * (num_buckets - max_exact)).long()
    log_bucket = log_bucket.clamp(max=num_buckets - 1)
    return direction_offset + torch.where(n < max_exact, n, log_bucket)


@POSITION.register("t5")
class T5Position(Position):
    def __init__(
        self,
        dims: ModelDims,
        num_buckets: int = 32,
        max_distance: int = 128,
        bidirectional: bool = False,
        shared_across_layers: bool = True,
        init_std: float = 0.02,
    ):
        super().__init__()
        self.bidirectional, self.num_buckets, self.max_distance = (
            bidirectional, num_buckets, max_distance)
        self.tables = LayerwiseTable(
            dims.n_layers, shared_across_layers, (num_buckets, dims.n_heads), init_std
        )  # per layer: (num_buckets, H)

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,
    ) -> torch.Tensor:  # (H, Tq, Tk)
        table = self.tables(layer)  # (num_buckets, H)
        distance = relative_distance(t_query, t_key, table.device)  # (Tq, Tk), any lengths
        buckets = relative_position_bucket(distance, self.bidirectional, self.num_buckets,
                                           self.max_distance)  # (Tq, Tk)
        return table[buckets].permute(2, 0, 1)  # (H, Tq, Tk)
