"""LiGLU (bilinear) feed-forward, ``W2 (W x * V x)``: a gated unit with no nonlinearity
(Shazeer 2020, "GLU Variants Improve Transformer"; named LiGLU by Narang et al. 2021)."""

import torch

from xformer_bench.activation import PARAM_MATCHED_SCALE, GatedFeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


def identity(x: torch.Tensor) -> torch.Tensor:
    return x


@ACTIVATION.register("liglu")
def build(dims: ModelDims, d_ff_scale: float = PARAM_MATCHED_SCALE,
          bias: bool = False) -> GatedFeedForward:
    return GatedFeedForward(dims, identity, d_ff_scale, bias)
