"""All-attention layer: self-attention over the sequence plus learned persistent memory
(Sukhbaatar, Grave, Lample, Jegou & Joulin 2019, "Augmenting Self-attention with Persistent
Memory").

Every head h of every layer owns ``N = n_persistent`` key/value pairs, the columns of the
paper's ``M_k`` and ``M_v`` (dh x N).  They are concatenated to that head's keys and values,
``K_t = [M_k, k_1 .. k_t]``, ``V_t = [M_v, v_1 .. v_t]``, and one softmax runs over all of them
(section 4, the all-attention layer):

    a_t = softmax(q_t^T K_t / sqrt(dh)),    y_t = V_t a_t.

The persistent vectors depend on no input and sit at no position: every query sees them,
causal or not; no position term touches them.  Here that means

* the causal mask and the key padding mask cover the sequence keys only;
* an additive bias (T5, ALiBi, Shaw) is evaluated on the sequence pairs, and the persistent
  slots get bias 0 (the paper adds its relative position embeddings to the context keys only);
* rotary positions rotate the sequence queries and keys (in
  :class:`~xformer_bench.attention.multi_head.MultiHeadAttention`, before this kernel); the
  persistent keys are never rotated.

A row whose sequence keys are all padding still attends to the memory: a finite output.

With ``ffn=none`` this is the paper's all-attention network, the feed-forward sublayers
replaced by the memory (M_k and M_v read as the two matrices of a feed-forward layer, section
4.1); with the default dense feed-forward it is self-attention augmented with memory.

Initialisation follows the authors' code (facebookresearch/adaptive-span,
``persistent_memory.py``): keys are stored as N(0, 1/dh) and used times sqrt(dh), values stored
as N(0, 1/N) and used times sqrt(N) -- unit-variance vectors at use, with the parameters on the
scale of an input-width-normalised weight (the re-parametrisation matters for the optimiser's
step size).  Default N = 1024 per head: the paper's small enwik8/text8 models (the large ones
use 2048).  Differences from the paper: no adaptive attention span and no cached context of
previous segments -- the keys are those the model hands the kernel.

Cost: full attention over S + N keys, through ``scaled_dot_product_attention`` with an
explicit (T, N + S) mask when a causal mask, bias or padding is needed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import EXACT_ATTENTION, AttentionKernel
from xformer_bench.attention.full import causal_mask
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("persistent_memory")
class PersistentMemoryAttention(AttentionKernel):
    provides = EXACT_ATTENTION

    def __init__(self, dims: ModelDims, n_persistent: int = 1024, dropout: float = 0.0):
        super().__init__()
        if n_persistent < 0:
            raise ConfigError(f"attention.n_persistent={n_persistent} must be 0 or more")
        h, dh = dims.n_heads, dims.head_dim
        self.n_persistent = n_persistent
        self.dropout = dropout
        self.key_scale, self.value_scale = math.sqrt(dh), math.sqrt(n_persistent)
        self.keys = nn.Parameter(torch.randn(h, n_persistent, dh) / self.key_scale)  # (H, N, Dh)
        self.values = nn.Parameter(
            torch.randn(h, n_persistent, dh) / max(self.value_scale, 1.0))  # (H, N, Dh)

    def memory(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The persistent keys and values as attention uses them: (H, N, Dh) each."""
        return self.keys * self.key_scale, self.values * self.value_scale

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
        b, t, s = q.shape[0], q.shape[-2], k.shape[-2]
        memory_k, memory_v = (m.to(k.dtype).expand(b, -1, -1, -1) for m in self.memory())
        k = torch.cat([memory_k, k], dim=-2)  # (B, H, N + S, Dh)
        v = torch.cat([memory_v, v], dim=-2)  # (B, H, N + S, Dh)
        p = self.dropout if self.training else 0.0
        if not causal and bias is None and key_padding_mask is None:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        mask = bias.dense() if bias is not None else q.new_zeros(t, s)  # (T, S) | (H|B,H, T, S)
        if causal:
            mask = mask.masked_fill(causal_mask(t, s, q.device), float("-inf"))
        if key_padding_mask is not None:
            mask = mask.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        mask = F.pad(mask, (self.n_persistent, 0))  # (..., T, N + S): memory always visible, bias 0
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), dropout_p=p)
