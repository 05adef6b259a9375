"""Layer normalisation (Ba et al. 2016)."""

from torch import nn

from xformer_bench.registry import NORM


@NORM.register("layernorm")
def build(dim: int, eps: float = 1e-5) -> nn.Module:
    return nn.LayerNorm(dim, eps=eps)
