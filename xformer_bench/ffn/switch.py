"""Switch feed-forward: each token goes to its single best expert, whose output is scaled by
the router probability (Fedus et al. 2021, "Switch Transformers: Scaling to Trillion
Parameter Models with Simple and Efficient Sparsity").  The router is a plain softmax in
float32 (no jitter noise); see :class:`~xformer_bench.ffn.RoutedExperts`."""

from collections.abc import Mapping
from typing import Any

from xformer_bench.ffn import RoutedExperts
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import FFN


@FFN.register("switch")
def build(dims: ModelDims, activation: Mapping[str, Any], num_experts: int = 8,
          capacity_factor: float = 1.25, aux_loss_weight: float = 0.01) -> RoutedExperts:
    return RoutedExperts(dims, activation, num_experts, top_k=1,
                         capacity_factor=capacity_factor, aux_loss_weight=aux_loss_weight)
