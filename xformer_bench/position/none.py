"""No position information (causal attention alone can infer order; Haviv et al. 2022)."""

from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import POSITION


@POSITION.register("none")
def build(dims: ModelDims) -> Position:
    return Position()
