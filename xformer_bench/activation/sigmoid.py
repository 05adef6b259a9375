"""Sigmoid feed-forward, as compared by Narang et al. (2021)."""

import torch

from xformer_bench.activation import FeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


@ACTIVATION.register("sigmoid")
def build(dims: ModelDims) -> FeedForward:
    return FeedForward(dims, torch.sigmoid)
