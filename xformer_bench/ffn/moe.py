"""Top-2 mixture of experts: Shazeer et al. (2017), "Outrageously Large Neural Networks: The
Sparsely-Gated Mixture-of-Experts Layer", with the top-2 gating, expert capacity and
first-choice priority of Lepikhin et al. (2020), "GShard", and the load-balancing loss of
Fedus et al. (2021).  The router is a plain softmax (no gating noise, no random second
expert); see :class:`~xformer_bench.ffn.RoutedExperts`."""

from collections.abc import Mapping
from typing import Any

from xformer_bench.ffn import RoutedExperts
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import FFN


@FFN.register("moe")
def build(dims: ModelDims, activation: Mapping[str, Any], num_experts: int = 8,
          capacity_factor: float = 1.25, aux_loss_weight: float = 0.01) -> RoutedExperts:
    return RoutedExperts(dims, activation, num_experts, top_k=2,
                         capacity_factor=capacity_factor, aux_loss_weight=aux_loss_weight)
