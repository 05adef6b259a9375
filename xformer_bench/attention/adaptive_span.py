"""Adaptive attention span: Sukhbaatar, Grave, Bojanowski & Joulin 2019, "Adaptive Attention
Span in Transformers" (ACL 2019), with the details of the authors' code
(facebookresearch/adaptive-span, ``adaptive_span.py``).

Each head h learns a span z_h in [0, S] (S = ``max_span``).  A key at distance x = i - j from
the query is weighted by the soft mask of ramp R (``ramp``)

    m_z(x) = min(max((R + z - x) / R, 0), 1),

and the weights are renormalised:

    a_ij = m_z(i - j) exp(s_ij) / sum_r m_z(i - r) exp(s_ir),   s_ij = q_i . k_j / sqrt(Dh) + b_ij,

computed as softmax(s_ij + log m_z(i - j)) (the same weights; the authors' code divides by the
sum plus 1e-8), a key with m = 0 given no weight at all.  The loss gains the L1 penalty
lambda / M sum_h z_h per layer (M heads, lambda = ``span_penalty``), added through the
auxiliary-loss hook in training.

**Parametrisation** (the authors' ``AdaptiveMask``): z_h = S * f_h with a learned fraction f_h,
clamped to [0, 1] after every optimiser step (their ``clamp_param``) -- here at the start of
each training forward, before the fraction is used -- and read through a clamp as well.
``init_span`` gives z at initialisation, in positions (their ``adapt_span_init`` = 0: every
span starts at the ramp alone).  The penalty is their ``get_loss``: lambda * S * mean_h f_h.

**Cost** falls as the spans shrink: a query attends only the keys within the current largest
reach ceil(max_h z_h) + R (at most S; the authors' ``get_current_max_size``), gathered blockwise
(:func:`~xformer_bench.attention._ops.logits.band_attention`): O(T * reach), never T x T while the
reach is short.  Once the reach covers all n keys of the call (reach >= n) a band would gather
more keys than there are (reach plus a block of up to 128 per query, twice the reach
bidirectional: 1.06 n^2 causal, 2.06 n^2 bidirectional per head at n = 2048), so the kernel
takes the dense path instead: full attention with log m as an additive bias
(:class:`~xformer_bench.attention.full.FullAttention`), the same pairs and logits, no larger
than dense attention with a per-head bias.  The paper is a causal LM over a cache of S past
positions; this layer attends within the current sequence (no cache), causal; bidirectional
(|i - j|, both sides) is offered too.  :meth:`AdaptiveSpanAttention.mean_span` reports the
mean span for the run record.

torch.compile: not one graph (the band's width is the learned span read on the host
(Tensor.item): the method's saving is a data-dependent shape; tests/test_compile.py).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.logits import NEGATIVE, band_attention, plus_distance_term
from xformer_bench.attention.full import FullAttention
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION

TINY = torch.finfo(torch.float32).tiny


class AdaptiveSpanKernel(AttentionKernel):
    """Softmax attention under the soft span mask of each head, over the keys in reach."""

    provides = frozenset({"causal", "bidirectional", "additive_bias", "longer_keys",
                          "key_padding_mask", "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, max_span: int, ramp: int, init_span: float):
        super().__init__()
        if max_span < 1 or ramp < 1:
            raise ValueError(f"attention.max_span={max_span} and ramp={ramp} must be >= 1")
        if not 0 <= init_span <= max_span:
            raise ValueError(f"attention.init_span={init_span} must lie in [0, max_span]")
        self.max_span, self.ramp = max_span, ramp
        self.span_fraction = nn.Parameter(torch.full((dims.n_heads,), init_span / max_span))  # (H,)
        self.dense = FullAttention(dims)  # once the reach covers every key
        self._projected_version: int | None = None  # span_fraction's version when last clamped

    def spans(self) -> torch.Tensor:  # (H,) z in positions
        return self.max_span * self.span_fraction.clamp(0, 1)

    def current_spans(self) -> torch.Tensor:  # (H,), detached
        return self.spans().detach()

    @torch.no_grad()
    def project(self) -> None:
        """Clamp the learned fractions back into [0, 1] (the authors' ``clamp_param``), once
        after each change of them (an optimiser step; the parameter's version counter says so,
        read on the host): never again in the same step, where the fractions may already be in
        a graph (a block applied twice, checkpointing's replay), and without reading them to
        decide (no host synchronisation on a GPU).  Clamping values in range changes nothing."""
        fraction = self.span_fraction
        if fraction._version != self._projected_version:
            fraction.clamp_(0, 1)
            self._projected_version = fraction._version

    def reach(self) -> int:
        """Keys per query, itself included, that any head can weigh: ceil(max z) + R, <= S.
        The band's shape follows the learned spans -- the method's saving -- so this reads the
        spans from the device: on a GPU the host waits for it, once per layer and step."""
        return min(self.max_span, math.ceil(self.current_spans().max().item()) + self.ramp)

    def log_mask(self, distance: torch.Tensor) -> torch.Tensor:  # (*S) long -> (H, *S)
        """log m_z(|j - i|) per head; pairs the mask zeroes get a logit of no weight."""
        z = self.spans().view(-1, *(1,) * distance.dim())  # (H, 1, ...)
        mask = ((self.ramp + z - distance.abs().float()) / self.ramp).clamp(0, 1)  # (H, *S)
        return torch.where(mask > 0, mask.clamp(min=TINY).log(), NEGATIVE / 2)

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
        reach = self.reach()
        masked = plus_distance_term(bias, self.log_mask, t, s, q.device)
        if reach >= s:  # a band would hold every key and more: dense, the same pairs
            return self.dense(q, k, v, causal=causal, bias=masked,
                              key_padding_mask=key_padding_mask)
        return band_attention(q, k, v, before=reach - 1, after=reach - 1, causal=causal,
                              bias=masked, key_padding_mask=key_padding_mask)


@ATTENTION.register("adaptive_span")
class AdaptiveSpanAttention(MultiHeadAttention):
    """Multi-head attention whose kernel is :class:`AdaptiveSpanKernel`; in training it adds
    the span penalty to the context's auxiliary losses."""

    decode_state = "none"  # not checked against the forward pass with cached keys

    def __init__(self, dims: ModelDims, max_span: int = 8192, ramp: int = 32,
                 span_penalty: float = 2e-6, init_span: float = 0.0):
        super().__init__(dims, AdaptiveSpanKernel(dims, max_span, ramp, init_span))
        self.span_penalty = span_penalty

    def penalty(self) -> torch.Tensor:
        """lambda / M sum_h z_h: the L1 penalty on this layer's spans."""
        return self.span_penalty * self.kernel.spans().mean()

    def mean_span(self) -> float:
        """Mean learned span z over the heads, in positions (for the run record)."""
        return self.kernel.current_spans().mean().item()

    def report(self) -> dict[str, float]:
        """What the run record shows of this layer (averaged over layers: ``model_report``)."""
        return {"mean_span": self.mean_span()}

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        if self.training:
            self.kernel.project()
            if self.span_penalty:
                ctx.add_auxiliary_loss(self.penalty())
        return super().forward(x, ctx)
