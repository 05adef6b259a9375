"""ReGLU feed-forward, ``W2 (relu(W x) * V x)`` (Shazeer 2020, "GLU Variants Improve
Transformer")."""

import torch.nn.functional as F

from xformer_bench.activation import PARAM_MATCHED_SCALE, GatedFeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


@ACTIVATION.register("reglu")
def build(dims: ModelDims, d_ff_scale: float = PARAM_MATCHED_SCALE,
          bias: bool = False) -> GatedFeedForward:
    return GatedFeedForward(dims, F.relu, d_ff_scale, bias)
