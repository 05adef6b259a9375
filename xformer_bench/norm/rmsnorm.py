"""Root-mean-square layer normalisation (Zhang & Sennrich 2019, "Root Mean Square Layer
Normalization"): ``g * x / sqrt(mean(x^2) + eps)`` -- LayerNorm without re-centring and
without a bias.  Computed in float32 and cast back, so it is safe under bf16 autocast."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.registry import NORM


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D)
        x32 = x.float()
        inverse_rms = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., 1)
        return (x32 * inverse_rms).type_as(x) * self.weight


@NORM.register("rmsnorm")
def build(dim: int, eps: float = 1e-6) -> nn.Module:
    return RMSNorm(dim, eps=eps)
