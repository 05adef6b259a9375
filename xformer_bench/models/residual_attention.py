"""Residual attention (RealFormer; He, Ravula, Kanagal & Ainslie 2021, "RealFormer: Transformer
Likes Residual Attention", Findings of ACL), ``model.residual_attention: true``.

Each layer adds the previous layer's attention logits to its own before the softmax (section
3, eq. (3)-(4)):

    Prev_l = Prev_{l-1} + Q_l K_l^T / sqrt(d_k) (+ the position bias),
    A_l = softmax(Prev_l (+ mask)) V_l,

so the raw scores form a residual stream of their own, across layers and per head (layers must
have the same number of heads; they do here).  Masks (causal, padding) are applied at each
layer and never enter the stream.  The logits are needed as a tensor, so this computes full
attention explicitly -- it applies only to ``attention=full`` (any other kernel either forms
no logits or only some of them): a one-line ``ConfigError`` otherwise.  With
``model.share_blocks`` the shared block still adds the previous application's logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xformer_bench.attention.full import FullAttention, causal_mask
from xformer_bench.errors import ConfigError
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims


class ResidualAttention(MultiHeadAttention):
    def __init__(self, dims: ModelDims, kernel: FullAttention, n_kv_heads: int | None = None):
        super().__init__(dims, kernel, n_kv_heads)
        self.scale = self.head_dim ** -0.5
        self.provides = self.provides - {"longer_keys"}  # logits over the segment's own keys

    @classmethod
    def replacing(cls, mixer: object, dims: ModelDims, attention_name: str) -> ResidualAttention:
        """The residual-attention form of the token mixer ``attention=...`` built (the model's
        capability check has refused, in words, a mixer that forms no logits)."""
        if not (isinstance(mixer, MultiHeadAttention) and type(mixer.kernel) is FullAttention):
            raise ConfigError(f"model.residual_attention=true (RealFormer) adds each layer's "
                              f"attention logits to the next's, which attention={attention_name} "
                              "does not form; use attention=full or residual_attention=false")
        return cls(dims, mixer.kernel, mixer.n_kv_heads)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        b, t, d = x.shape
        q, k, v = self.project(x)  # (B, H, T, Dh) each
        q, k = ctx.position.rotate(q, k)
        k, v = self.share_kv_heads(k), self.share_kv_heads(v)  # (B, H, T, Dh) each
        logits = torch.matmul(q, k.transpose(-1, -2)) * self.scale  # (B, H, T, T)
        keys = {"key": k} if ctx.position.reads_keys else {}  # Transformer-XL's u . k term
        bias = ctx.position.bias(t, t, layer=ctx.layer, query=q, **keys)
        if bias is not None:
            logits = logits + bias.dense()
        if ctx.previous_logits is not None:
            logits = logits + ctx.previous_logits
        ctx.previous_logits = logits
        masked, lowest = logits, torch.finfo(logits.dtype).min  # a row all padding stays finite
        if ctx.causal:
            masked = masked.masked_fill(causal_mask(t, t, x.device), lowest)
        if ctx.key_padding_mask is not None:
            masked = masked.masked_fill(ctx.key_padding_mask[:, None, None, :], lowest)
        weights = F.dropout(masked.softmax(dim=-1), self.kernel.dropout, self.training)
        y = torch.matmul(weights, v)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(b, t, d))
