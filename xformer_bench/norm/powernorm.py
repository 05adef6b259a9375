"""Power normalisation (Shen, Yao, Gholami, Mahoney & Keutzer 2020, "PowerNorm: Rethinking
Batch Normalization in Transformers").

Two steps, as in the authors' code:

1. layer-scale: each token is divided by its root mean square over the features (no
   parameters), ``u = x / sqrt(mean_D(x^2) + eps)``;
2. power normalisation: each feature is divided by a *running* quadratic mean ``psi^2``
   (no mean subtraction), then ``gamma * u / sqrt(psi^2 + eps) + beta``.  In training,
   after the forward, ``psi^2 <- a * psi^2 + (1 - a) * mean_{B,T}(u^2)`` without gradient.

Simplifications (this is the "inference-style" form of PN used in training too):

* the forward always uses the running statistic from *previous* steps, as PN does after its
  warm-up and at inference; the warm-up phase that normalises by the current batch's
  statistics is left out, because batch statistics over (B, T) would let later tokens change
  the normalisation of earlier ones in a causal LM.  ``psi^2`` starts at 1, the mean square
  of a layer-scaled token;
* no approximate backpropagation: the paper's correction term for the gradient through the
  running statistics is dropped, so the gradient treats ``psi`` as a constant;
* under DDP each rank updates its own statistic (DDP re-broadcasts rank 0's buffers).
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.registry import NORM


class PowerNorm(nn.Module):
    def __init__(self, dim: int, running_decay: float = 0.9, eps: float = 1e-5):
        super().__init__()
        self.running_decay, self.eps = running_decay, eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))
        self.register_buffer("running_quadratic_mean", torch.ones(dim))  # psi^2, (D,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., D)
        x32 = x.float()
        u = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., D) layer-scale
        y = u * torch.rsqrt(self.running_quadratic_mean + self.eps)  # (..., D)
        if self.training:
            with torch.no_grad():
                batch_quadratic_mean = u.pow(2).reshape(-1, u.shape[-1]).mean(0)  # (D,)
                self.running_quadratic_mean.lerp_(
                    batch_quadratic_mean.to(self.running_quadratic_mean.dtype), 1 - self.running_decay)
        return y.type_as(x) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, running_decay={self.running_decay}, eps={self.eps}"


@NORM.register("powernorm")
def build(dim: int, running_decay: float = 0.9, eps: float = 1e-5) -> nn.Module:
    return PowerNorm(dim, running_decay=running_decay, eps=eps)
