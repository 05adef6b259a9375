"""ReZero gate plus LayerNorm: ``x + a * f(LN(x))`` with ``a`` initialised at 0 -- the
"ReZero + LayerNorm" row of Narang et al. (2021); ReZero is Bachlechner et al. (2020),
LayerNorm Ba et al. (2016)."""

from torch import nn

from xformer_bench.norm import ReZero
from xformer_bench.registry import NORM


@NORM.register("rezero_layernorm")
def build(dim: int, eps: float = 1e-5) -> nn.Module:
    return ReZero(nn.LayerNorm(dim, eps=eps))
