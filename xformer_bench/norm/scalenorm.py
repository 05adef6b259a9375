"""ScaleNorm (Nguyen & Salazar 2019, "Transformers without Tears"): ``g * x / ||x||`` with a
single learned scalar ``g`` initialised at ``sqrt(d)``; the norm is clamped at ``eps``."""

from __future__ import annotations

import math

import torch
from torch import nn

from xformer_bench.registry import NORM


class ScaleNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.gain = nn.Parameter(torch.tensor(math.sqrt(dim)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D)
        x32 = x.float()
        length = torch.linalg.vector_norm(x32, dim=-1, keepdim=True).clamp(min=self.eps)  # (..., 1)
        return (self.gain * x32 / length).type_as(x)


@NORM.register("scalenorm")
def build(dim: int, eps: float = 1e-5) -> nn.Module:
    return ScaleNorm(dim, eps=eps)
