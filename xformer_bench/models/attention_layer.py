"""Multi-head attention: shared q/k/v/out projections around a pluggable kernel."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.models.dims import ModelDims
from xformer_bench.models.context import ForwardContext


class MultiHeadAttention(nn.Module):
    def __init__(self, dims: ModelDims, kernel: nn.Module, layer: int = 0, causal: bool = True):
        super().__init__()
        self.layer = layer  # lets a position scheme keep per-layer parameters
        self.n_heads = dims.n_heads
        self.causal = causal
        self.qkv = nn.Linear(dims.d_model, 3 * dims.d_model)
        self.out = nn.Linear(dims.d_model, dims.d_model)
        self.kernel = kernel

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        position = ctx.position
        b, t, d = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.n_heads, d // self.n_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, T, Dh)
        q, k = position.rotate(q, k)
        bias = position.bias(t, t, layer=self.layer, query=q)  # (H, T, T), (B, H, T, T) or None
        y = self.kernel(q, k, v, causal=self.causal, bias=bias)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(b, t, d))
