"""AdaNorm (Xu et al. 2019, "Understanding and Improving Layer Normalization").

LayerNorm without gain and bias, ``y = (x - mean) / sqrt(var + eps)``, rescaled adaptively:
``z = C * (1 - k * y) * y``.  The factor ``C * (1 - k * y)`` is treated as a constant in the
backward pass (the paper detaches it so that the gradient keeps LayerNorm's re-centring
property); the gradient flows through the second ``y`` only.  ``C = 1``, ``k = 0.1`` follow
the brief's defaults (the paper picks ``k = 1/10`` and a task-tuned ``C``)."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.registry import NORM


class AdaNorm(nn.Module):
    def __init__(self, scale: float = 1.0, k: float = 0.1, eps: float = 1e-5):
        super().__init__()
        self.scale, self.k, self.eps = scale, k, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D)
        x32 = x.float()
        mean = x32.mean(-1, keepdim=True)  # (..., 1)
        variance = x32.var(-1, unbiased=False, keepdim=True)  # (..., 1)
        y = (x32 - mean) * torch.rsqrt(variance + self.eps)  # (..., D)
        adaptive = (self.scale * (1 - self.k * y)).detach()  # (..., D), no gradient
        return (adaptive * y).type_as(x)

    def extra_repr(self) -> str:
        return f"C={self.scale}, k={self.k}, eps={self.eps}"


@NORM.register("adanorm")
def build(dim: int, scale: float = 1.0, k: float = 0.1, eps: float = 1e-5) -> nn.Module:
    del dim  # AdaNorm has no per-feature parameters
    return AdaNorm(scale=scale, k=k, eps=eps)
