"""ReZero gate plus RMSNorm: ``x + a * f(RMSNorm(x))`` with ``a`` initialised at 0 -- the
"ReZero + RMS Norm" row of Narang et al. (2021); ReZero is Bachlechner et al. (2020),
RMSNorm Zhang & Sennrich (2019)."""

from torch import nn

from xformer_bench.norm import ReZero
from xformer_bench.norm.rmsnorm import RMSNorm
from xformer_bench.registry import NORM


@NORM.register("rezero_rmsnorm")
def build(dim: int, eps: float = 1e-6) -> nn.Module:
    return ReZero(RMSNorm(dim, eps=eps))
