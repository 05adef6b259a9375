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

from xformer_bench.core.dims import ModelDims
from xformer_bench.position import LayerwiseTable, PairBias, Position
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
    requires = {"attention": frozenset({"additive_bias"})}

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
        self._tabulate(dims.seq_len)
        self.tables = LayerwiseTable(
            dims.n_layers, shared_across_layers, (num_buckets, dims.n_heads), init_std
        )  # per layer: (num_buckets, H)

    def _tabulate(self, length: int) -> None:
        """The bucket of every distance -(length-1) .. length-1, grown when keys outnumber it."""
        self.length = length
        distances = torch.arange(-(length - 1), length)  # (2L-1,)
        buckets = relative_position_bucket(distances, self.bidirectional, self.num_buckets,
                                           self.max_distance)  # (2L-1,)
        device = getattr(self, "bucket_of_distance", buckets).device
        self.register_buffer("bucket_of_distance", buckets.to(device), persistent=False)

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,
    ) -> PairBias:
        if t_key > self.length:  # memory or longer evaluation
            self._tabulate(t_key)
        table = self.tables(layer)  # (num_buckets, H)

        def at(query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:  # (H, *S)
            distance = bias.distance(query_index, key_index)  # S
            buckets = self.bucket_of_distance[distance + self.length - 1]  # S
            return table[buckets].movedim(-1, 0)  # (H, *S)

        bias = PairBias(t_query, t_key, self.bucket_of_distance.device, at)
        return bias
