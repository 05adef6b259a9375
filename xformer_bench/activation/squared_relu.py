"""Squared-ReLU feed-forward, ``relu(x)^2`` (So et al. 2021, "Primer")."""

import torch
import torch.nn.functional as F

from xformer_bench.activation import FeedForward
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    return F.relu(x).square()


@ACTIVATION.register("squared_relu")
def build(dims: ModelDims) -> FeedForward:
    return FeedForward(dims, squared_relu)
