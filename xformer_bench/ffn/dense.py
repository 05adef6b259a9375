"""The dense position-wise feed-forward layer, shaped by the chosen activation."""

from collections.abc import Mapping
from typing import Any

from torch import nn

from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ACTIVATION, FFN


@FFN.register("dense")
def build(dims: ModelDims, activation: Mapping[str, Any]) -> nn.Module:
    return ACTIVATION.build(activation, dims=dims)
