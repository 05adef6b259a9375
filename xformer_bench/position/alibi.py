"""Attention with Linear Biases, ALiBi (Press, Smith & Lewis 2022).

No position embedding: head ``h`` adds ``-m_h * (i - j)`` to the logit of query ``i`` and
key ``j``.  The slopes ``m_h`` are a geometric sequence starting at and multiplied by
``2^(-8/H)``; for ``H`` not a power of two the paper takes the slopes of the nearest power
of two below, ``P``, then every other slope of ``2P`` heads for the remaining ``H - P``.
Keys ahead of the query (masked by a causal model) get ``-m_h * (j - i)``, the usual
symmetric choice for a bidirectional encoder.
"""

from __future__ import annotations

import math

import torch

from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias, Position
from xformer_bench.registry import POSITION


def power_of_two_slopes(n_heads: int) -> list[float]:
    ratio = 2.0 ** (-8.0 / n_heads)
    return [ratio ** (h + 1) for h in range(n_heads)]


def alibi_slopes(n_heads: int) -> torch.Tensor:  # (H,)
    lower_power = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two_slopes(lower_power)
    slopes += power_of_two_slopes(2 * lower_power)[0::2][: n_heads - lower_power]
    return torch.tensor(slopes)


@POSITION.register("alibi")
class AlibiPosition(Position):
    requires = {"attention": frozenset({"additive_bias"})}

    def __init__(self, dims: ModelDims):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(dims.n_heads), persistent=False)  # (H,)

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,
    ) -> PairBias:
        def at(query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:  # (H, *S)
            distance = bias.distance(query_index, key_index).abs()  # S
            return -self.slopes.view(-1, *[1] * distance.dim()) * distance

        bias = PairBias(t_query, t_key, self.slopes.device, at)
        return bias
