"""Full softmax attention (Vaswani et al. 2017) through ``scaled_dot_product_attention``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.models.dims import ModelDims
from xformer_bench.registry import ATTENTION


@ATTENTION.register("full")
class FullAttention(nn.Module):
    def __init__(self, dims: ModelDims, dropout: float = 0.0):
        super().__init__()
        self.dropout = dropout

    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, S, Dh)
        v: torch.Tensor,  # (B, H, S, Dh)
        *,
        causal: bool,
        bias: torch.Tensor | None = None,  # (H, T, S) or (B, H, T, S) additive, or None
    ) -> torch.Tensor:  # (B, H, T, Dh)
        p = self.dropout if self.training else 0.0
        if bias is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        if causal:
            t, s = q.shape[-2], k.shape[-2]
            future = torch.ones(t, s, dtype=torch.bool, device=q.device).triu(s - t + 1)
            bias = bias.masked_fill(future, float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=p)
