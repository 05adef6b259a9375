"""Full softmax attention (Vaswani et al. 2017) through ``scaled_dot_product_attention``
(flash / memory-efficient kernels on GPU when there is no bias or padding mask)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xformer_bench.attention import EXACT_ATTENTION, AttentionKernel
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


def causal_mask(t_query: int, t_key: int, device: torch.device) -> torch.Tensor:
    """(Tq, Tk) bool, True where the key lies after the query (queries are the last keys)."""
    return torch.ones(t_query, t_key, dtype=torch.bool, device=device).triu(t_key - t_query + 1)


@ATTENTION.register("full")
class FullAttention(AttentionKernel):
    provides = EXACT_ATTENTION | {"dense_logits"}

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
        bias: PairBias | None = None,
        key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        p = self.dropout if self.training else 0.0
        t, s = q.shape[-2], k.shape[-2]
        if bias is None and key_padding_mask is None:
            if not causal or t == s:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)
        mask = bias.dense() if bias is not None else q.new_zeros(t, s)  # (H, T, S) | (B, H, T, S)
        if causal:
            mask = mask.masked_fill(causal_mask(t, s, q.device), float("-inf"))
        if key_padding_mask is not None:
            mask = mask.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=p)
