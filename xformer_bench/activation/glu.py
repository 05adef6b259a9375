"""GLU feed-forward, ``W2 (sigmoid(W x) * V x)``: the gated linear unit of Dauphin et al.
(2017) in the feed-forward layer (Shazeer 2020)."""

import torch

from xformer_bench.activation import PARAM_MATCHED_SCALE, GatedFeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


@ACTIVATION.register("glu")
def build(dims: ModelDims, d_ff_scale: float = PARAM_MATCHED_SCALE,
          bias: bool = False) -> GatedFeedForward:
    return GatedFeedForward(dims, torch.sigmoid, d_ff_scale, bias)
