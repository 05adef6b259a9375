"""SELU feed-forward (Klambauer et al. 2017), as compared by Narang et al. (2021)."""

import torch.nn.functional as F

from xformer_bench.activation import FeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


@ACTIVATION.register("selu")
def build(dims: ModelDims) -> FeedForward:
    return FeedForward(dims, F.selu)
