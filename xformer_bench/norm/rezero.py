"""ReZero (Bachlechner et al. 2020, "ReZero is All You Need: Fast Convergence at Large
Depth"): no normalisation at all; each residual branch is scaled by a learnable scalar
initialised at 0 (``x + a * f(x)``), so every layer starts as the identity map."""

from torch import nn

from xformer_bench.norm import ReZero
from xformer_bench.registry import NORM


@NORM.register("rezero")
def build(dim: int) -> nn.Module:
    del dim  # nothing is normalised: no per-feature parameters
    return ReZero(nn.Identity())
