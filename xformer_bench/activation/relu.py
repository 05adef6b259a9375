"""ReLU feed-forward (Vaswani et al. 2017)."""

import torch.nn.functional as F

from xformer_bench.activation import FeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


@ACTIVATION.register("relu")
def build(dims: ModelDims) -> FeedForward:
    return FeedForward(dims, F.relu)
