"""Cross-covariance attention, XCA (El-Nouby, Touvron, Caron, Bojanowski, Douze, Joulin,
Laptev, Neverova, Synnaeve, Verbeek & Jegou 2021, "XCiT: Cross-Covariance Image Transformers").

Attention over the channels instead of the tokens.  Per head, with Q, K, V the (T x dh)
queries, keys and values of the sequence (section 3, the XCA operation):

    Q^, K^ = Q, K with each column (channel) l2-normalised along the sequence axis,
    A = softmax(Q^^T K^ * tau)                         (dh x dh, softmax over key channels),
    XCA(Q, K, V) = V A^T        i.e. y_t[i] = sum_j A[i, j] v_t[j],

with tau a learned temperature per head.  The attention matrix is dh x dh, a sum over tokens of
q^_t k^_t^T: time O(T dh^2) and memory O(T dh + dh^2), linear in T (``sub_quadratic``).  The
normalisation bounds the logits by tau (cosine similarities), which is why no 1/sqrt(dh)
scale is used.

Following the authors' code (facebookresearch/xcit): tau multiplies the logits, starts at 1,
and is left out of weight decay (here it is a 1-D parameter, which this benchmark's optimizer
does not decay); attention dropout acts on A.

What it supports: every output position mixes statistics of the whole sequence, so XCA is
bidirectional only -- a causal variant would need per-prefix covariances, which the paper does
not define, so ``causal`` is not declared and the decoder-only LM refuses it.  A key padding
mask is honoured by leaving padded positions out of the covariance (their queries and keys are
zeroed before the normalisation); queries and keys must cover the same positions (no
``longer_keys``); there are no token pairs, so no additive bias.  XCiT's local patch
interaction (a convolution over image patches) and class-attention layers belong to the image
architecture and are not part of this token mixer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("xcit")
class CrossCovarianceAttention(AttentionKernel):
    provides = frozenset({"bidirectional", "key_padding_mask", "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, dropout: float = 0.0):
        super().__init__()
        self.temperature = nn.Parameter(torch.ones(dims.n_heads))  # (H,) tau, one per head
        self.dropout = nn.Dropout(dropout)

    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, S, Dh), S = T
        v: torch.Tensor,  # (B, H, S, Dh)
        *,
        causal: bool,
        bias: PairBias | None = None,
        key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        if causal or bias is not None or k.shape[-2] != q.shape[-2]:
            raise ValueError("cross-covariance attention is bidirectional self-attention over "
                             "one sequence: no causal mask, additive bias or longer keys")
        if key_padding_mask is not None:
            keep = (~key_padding_mask)[:, None, :, None].to(q.dtype)  # (B, 1, T, 1)
            q, k = q * keep, k * keep
        q = F.normalize(q, dim=-2)  # (B, H, T, Dh): every channel unit-norm over the sequence
        k = F.normalize(k, dim=-2)  # (B, H, T, Dh)
        logits = q.transpose(-1, -2) @ k  # (B, H, Dh, Dh): [i, j] = q^_i . k^_j
        attention = (logits * self.temperature[:, None, None]).softmax(-1)  # (B, H, Dh, Dh)
        return v @ self.dropout(attention).transpose(-1, -2)  # (B, H, T, Dh)
