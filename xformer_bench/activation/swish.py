"""Swish feed-forward, ``x * sigmoid(x)`` (Ramachandran et al. 2017; the SiLU of
Elfwing et al. 2018), as compared by Narang et al. (2021)."""

import torch.nn.functional as F

from xformer_bench.activation import FeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


@ACTIVATION.register("swish")
def build(dims: ModelDims) -> FeedForward:
    return FeedForward(dims, F.silu)
