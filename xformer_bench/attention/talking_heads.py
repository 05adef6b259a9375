"""Talking-heads attention: Shazeer, Lan, Cheng, Ding & Hou 2020, "Talking-Heads Attention"
(arXiv:2003.02436): learned linear maps across the heads of the attention logits,
just before the softmax, and of the attention weights, just after it:

    J = q k^T / sqrt(Dh)                        (B, h_k, T, S)  per-head logits
    L[h]  = sum_k J[k] P_l[k, h]  (+ bias, mask)  (B, h, T, S)    logits  "talk" across heads
    W = softmax(L)                                (B, h, T, S)
    U[v]  = sum_h W[h] P_w[h, v]                  (B, h_v, T, S)  weights "talk" across heads
    out = U v                                     (B, h_v, T, Dh)

With P_l = P_w = I it is multi-head attention.  The additive position bias and the masks are
added to the mixed logits L, as in the authors' Mesh TensorFlow ``TalkingHeadsSelfAttention``
(``logits += bias`` after the logits projection): causality and padding hold for every head,
and a position bias stays a bias of the softmax head it is added to.

**Initialisation**: the paper gives none in its text; the authors' implementation creates
both maps with Mesh TensorFlow's default dense-layer initialiser, variance scaling with
scale 1 over the fan-in, i.e. N(0, 1/h) for an h x h map -- not the identity.

**Simplification**: the paper lets the numbers of key, softmax and value heads (h_k, h, h_v)
differ; here all three are ``n_heads`` (the q/k/v projections of
:class:`~xformer_bench.attention.multi_head.MultiHeadAttention` give n_heads heads), the
setting of its "talking-heads" rows with h_k = h = h_v.  Every pair is computed (the paper is
about quality, not cost): O(T S) per head, plus O(H^2 T S) for the two maps.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.logits import allowed_pairs, masked_softmax
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("talking_heads")
class TalkingHeadsAttention(AttentionKernel):
    def __init__(self, dims: ModelDims):
        super().__init__()
        h = dims.n_heads
        std = h ** -0.5  # Mesh TF variance scaling: 1 / fan-in
        self.logits_map = nn.Parameter(torch.randn(h, h) * std)  # P_l (h_k, h)
        self.weights_map = nn.Parameter(torch.randn(h, h) * std)  # P_w (h, h_v)

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
        t, s = q.shape[-2], k.shape[-2]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])  # (B, H_k, T, S)
        logits = torch.einsum("bkts,kh->bhts", scores, self.logits_map.to(scores.dtype))
        if bias is not None:
            logits = logits + bias.dense()  # (B, H, T, S)
        valid = allowed_pairs(t, s, causal=causal, key_padding_mask=key_padding_mask,
                              device=q.device)  # (T, S) | (B, 1, T, S)
        weights = masked_softmax(logits, valid)  # (B, H, T, S)
        weights = torch.einsum("bhts,hv->bvts", weights, self.weights_map.float())  # (B, H_v, T, S)
        return weights.to(v.dtype) @ v  # (B, H_v, T, Dh)
