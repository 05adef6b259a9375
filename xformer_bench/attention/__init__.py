"""The ``attention`` group: token mixers, the sublayer that moves information between positions.

A registered builder takes ``dims`` (:class:`~xformer_bench.core.dims.ModelDims`) plus the
keys of its YAML and returns one of two kinds of module, told apart by base class:

* an :class:`AttentionKernel` -- ``kernel(q, k, v, *, causal, bias=None, key_padding_mask=None,
  layer=0)`` over (B, H, T, Dh) queries and (B, H, S, Dh) keys and values (S >= T: the queries
  are the last T positions; ``layer`` is ``ctx.layer``, for patterns that alternate or are drawn
  per layer).  The model wraps it in
  :class:`~xformer_bench.attention.multi_head.MultiHeadAttention`, the one home of the q/k/v
  and output projections; a kernel that needs parameters of its own owns them.
* a :class:`TokenMixer` -- ``mixer(x, ctx) -> x`` over (B, T, D), the whole sublayer: a layer
  with no queries or keys (FNet, MLP-Mixer, gMLP), or attention with projections of its own
  (shared-QK LSH, or ``MultiHeadAttention(kernel, n_kv_heads=...)`` for multi-query).

Both declare in ``provides`` what they support, from :data:`CAPABILITIES`; the model checks
every part's needs against them when it is built (:mod:`xformer_bench.models.capabilities`),
so an impossible combination is one ``ConfigError`` line before training.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from xformer_bench.core.context import ForwardContext
    from xformer_bench.position import PairBias

CAPABILITIES = {
    "causal": "causal (decoder) attention",
    "bidirectional": "bidirectional (encoder) attention",
    "additive_bias": "an additive attention bias (T5, ALiBi, Shaw)",
    "queries_and_keys": "queries and keys (rotary positions)",
    "longer_keys": "more keys than queries (memory, cross-attention)",
    "key_padding_mask": "a key padding mask",
    "variable_length": "inputs of any length",
    "dense_logits": "every attention logit as one tensor (RealFormer adds them layer to layer)",
}
"""What a token mixer may declare it supports, and the words an error uses for it."""

FAMILIES = {
    "dense": "every (query, key) pair, refined (heads, priors, spans, branches)",
    "fixed_pattern": "a fixed sparsity pattern (windows, blocks, strides, axes)",
    "fixed_pattern+memory": "a fixed pattern plus global tokens",
    "learnable_pattern": "a pattern learnt from the content (hashing, clustering, sorting)",
    "low_rank": "keys and values projected to a shorter length",
    "downsampling": "keys and values pooled or strided",
    "kernel": "a kernel feature map in place of the softmax",
    "memory": "learnt memory vectors beside the keys",
    "synthetic": "attention weights not computed from query-key products",
    "transposed": "attention across channels instead of positions",
    "attention_free": "token mixing without attention (Fourier, MLP, gating)",
    "convolution": "convolutions over positions",
    "recurrent": "a recurrent state (state-space, gated linear, delta rule, long convolution)",
}
"""The families of Tay, Dehghani, Bahri & Metzler 2022 ("Efficient Transformers: A Survey"),
plus the attention-free and recurrent mixers that followed; each option's YAML names one
(``family:``), which the README's table and the studies read."""

EXACT_ATTENTION = frozenset(CAPABILITIES) - {"queries_and_keys", "dense_logits"}
"""What a kernel that computes every (query, key) pair supports: everything but handing its
logits over (only ``full`` does, through ``model.residual_attention``'s explicit form)."""


class AttentionKernel(nn.Module):
    """Attention over projected heads; subclasses implement :meth:`forward` and narrow
    ``provides`` to what they honour."""

    provides: frozenset[str] = EXACT_ATTENTION
    sub_quadratic: bool = False
    """Its paper claims time and memory below T^2: the allocation test holds it to that."""
    decodes_by_position: bool = True
    """Its pattern is laid out by absolute position, so queries given one at a time against
    cached keys score as the forward pass does (axial attention's grid is laid over the
    queries it is given: False)."""

    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, S, Dh)
        v: torch.Tensor,  # (B, H, S, Dh)
        *,
        causal: bool,
        bias: PairBias | None = None,  # additive, lazy: evaluate on the pairs computed
        key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        raise NotImplementedError


class TokenMixer(nn.Module):
    """A whole token-mixing sublayer, ``(B, T, D) -> (B, T, D)``; reads what it needs from the
    forward context (``ctx.causal``, ``ctx.position``, ``ctx.layer`` ...).  Declares nothing by
    default: a mixer says what it supports."""

    provides: frozenset[str] = frozenset()
    sub_quadratic: bool = False
    decode_state: str = "none"
    """What it keeps between incremental decoding steps, one of
    :data:`~xformer_bench.core.decode_cache.DECODE_STATES`: ``keys_values`` (multi-head attention
    over cacheable keys), ``recurrent`` (it reads and writes ``ctx.cache.slot()["state"]``),
    ``history`` (``ctx.cache.slot()["history"]``: its past inputs) or ``none`` (the caller
    recomputes the window)."""

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        raise NotImplementedError
