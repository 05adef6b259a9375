"""ELU feed-forward (Clevert et al. 2016), as compared by Narang et al. (2021)."""

import torch.nn.functional as F

from xformer_bench.activation import FeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


@ACTIVATION.register("elu")
def build(dims: ModelDims) -> FeedForward:
    return FeedForward(dims, F.elu)
