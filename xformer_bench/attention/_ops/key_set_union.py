"""Softmax attention over a union of key sets, each set through PyTorch's fused CPU attention
kernel, merged exactly by log-sum-exp (the split-key merge of Flash-Decoding, Dao et al. 2023;
Milakov & Gimelshein 2018's online softmax).

Each :class:`KeyCall` runs the fused kernel on a :class:`Span` of the queries against a span of
one key set and returns their partial output O_c and log-normaliser L_c.  Calls in one *slot*
cover disjoint queries; a query's slots are merged as O = sum_s exp(L_s - L) O_s,
L = logsumexp_s L_s.  The backward pass calls the kernel's backward once per call with the
*merged* O and L: with P = exp(S - L) and D = rowsum(dO * O) that is the merged softmax's
gradient restricted to the call's keys, dS = P (dP - D).  Nothing of size queries x keys is
kept: q, k, v, the output and its float32 normaliser, as full attention's fused kernel keeps.
Spans are strided views of contiguous q, k, v (the kernel reads strides): nothing is gathered.

CPU only: it calls ``aten._scaled_dot_product_flash_attention_for_cpu`` and its backward, the
kernel behind ``scaled_dot_product_attention`` on CPU, because the public function does not
return the normaliser.  A query must have a key in some call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def fused_applies(kernel, q: torch.Tensor, k: torch.Tensor, causal: bool, bias,
                  key_padding_mask) -> bool:
    """Whether a kernel with a fused CPU path takes it: causal, on CPU, a query at every key
    position (training and evaluation; not a decode step over cached keys, where the grid would
    be mostly padding), without an additive bias or key padding, and ``kernel.fused_on_cpu``
    (tests turn it off to compare)."""
    return (getattr(kernel, "fused_on_cpu", True) and q.device.type == "cpu" and causal
            and q.shape[-2] == k.shape[-2] and bias is None and key_padding_mask is None)


@dataclass(frozen=True)
class Span:
    """Positions ``start, start + step, ...`` below ``stop`` of a (B H, N, X) sequence as
    ``groups`` independent groups, (B H, groups, L / groups, X): consecutive runs, or with
    ``columns`` the columns of the span laid out in rows of ``groups`` (group r: its r-th,
    (r + groups)-th, ... position)."""

    start: int
    stop: int
    groups: int = 1
    columns: bool = False
    step: int = 1

    def covers(self, n: int) -> bool:
        """Whether the span is all N positions in order (its groups' layout is the sequence's)."""
        return self.start == 0 and self.stop >= n and self.step == 1 and not self.columns

    def of(self, x: torch.Tensor) -> torch.Tensor:
        span = x[:, self.start:self.stop:self.step]
        if self.columns:
            return span.unflatten(1, (-1, self.groups)).transpose(1, 2)
        return span.unflatten(1, (self.groups, -1))


@dataclass(frozen=True, eq=False)
class KeyCall:
    """One fused call: ``queries`` against ``keys`` of key set ``source``, group by group;
    ``causal``: query r of a group sees keys <= r (top-left aligned); ``allowed``: a (gq, gk)
    bool pattern within each group.  A query ``allowed`` gives no key contributes nothing here."""

    slot: int
    queries: Span
    keys: Span
    source: int = 0
    causal: bool = False
    allowed: torch.Tensor | None = None

    def scores_mask(self, dtype: torch.dtype) -> torch.Tensor | None:
        if self.allowed is None:
            return None
        return torch.zeros(self.allowed.shape, dtype=dtype).masked_fill_(~self.allowed,
                                                                         float("-inf"))


def _flat(x: torch.Tensor) -> torch.Tensor:  # (B, H, N, X) -> (B H, N, X)
    return x.flatten(0, 1)


class KeySetUnion(torch.autograd.Function):
    """``apply(calls, scale, q, k_0, v_0, k_1, v_1, ...)`` -> (B, H, N, D): one softmax per query
    over the keys its calls give it.  q (B, H, N, D); each key set (B, H, S_i, D)."""

    @staticmethod
    def forward(ctx, calls: tuple[KeyCall, ...], scale: float, q: torch.Tensor,
                *sets: torch.Tensor) -> torch.Tensor:
        b, h, n, d = q.shape
        q, sets = _flat(q.contiguous()), [_flat(x.contiguous()) for x in sets]
        slots = 1 + max(call.slot for call in calls)
        outs = q.new_zeros(slots, b * h, n, d)
        lses = q.new_full((slots, b * h, n, 1), float("-inf"),  # the kernel's: float32 or wider
                          dtype=torch.promote_types(q.dtype, torch.float32))
        for call in calls:
            out, lse = _FORWARD(call.queries.of(q), call.keys.of(sets[2 * call.source]),
                                call.keys.of(sets[2 * call.source + 1]), 0.0, call.causal,
                                attn_mask=call.scores_mask(q.dtype), scale=scale)
            if call.allowed is not None:  # a row with no key reports L = 0: none here
                lse = lse.masked_fill(~call.allowed.any(-1), float("-inf"))
            call.queries.of(outs[call.slot]).copy_(out)
            call.queries.of(lses[call.slot]).copy_(lse.unsqueeze(-1))
        lse = lses.logsumexp(0)  # (B H, N, 1)
        weights = (lses - lse).exp().nan_to_num_(0.0)  # a query no slot reaches: 0
        # (B, H, N, D) laid out as (B, N, H, D), as the fused kernel lays out its output: the
        # heads' merge after attention is then a view, not a second copy kept for backward
        out = q.new_empty(b, n, h, d).transpose(1, 2)
        out.copy_((weights.to(outs.dtype) * outs).sum(0).unflatten(0, (b, h)))
        ctx.calls, ctx.scale = calls, scale
        ctx.save_for_backward(q, out, lse, *sets)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        q, out, lse, *sets = ctx.saved_tensors
        b, h = grad.shape[:2]
        grad, out = (_flat(x.contiguous()) for x in (grad, out))
        inputs = (q, *sets)
        grads: list[torch.Tensor | None] = [None] * len(inputs)

        def accumulate(index: int, span: Span, value: torch.Tensor) -> None:
            if grads[index] is None and span.covers(inputs[index].shape[1]):
                grads[index] = value.reshape(inputs[index].shape)  # the first: no zeroed buffer
                return
            if grads[index] is None:
                grads[index] = torch.zeros_like(inputs[index])
            span.of(grads[index]).add_(value)

        for call in ctx.calls:
            k, v = sets[2 * call.source], sets[2 * call.source + 1]
            dq, dk, dv = _BACKWARD(call.queries.of(grad), call.queries.of(q), call.keys.of(k),
                                   call.keys.of(v), call.queries.of(out),
                                   call.queries.of(lse).squeeze(-1), 0.0, call.causal,
                                   attn_mask=call.scores_mask(q.dtype), scale=ctx.scale)
            accumulate(0, call.queries, dq)
            accumulate(1 + 2 * call.source, call.keys, dk)
            accumulate(2 + 2 * call.source, call.keys, dv)
        grads = [torch.zeros_like(x) if g is None else g for x, g in zip(inputs, grads)]
        return (None, None, *(g.unflatten(0, (b, h)) for g in grads))


def key_set_union(calls: tuple[KeyCall, ...], q: torch.Tensor, *sets: torch.Tensor,
                  scale: float) -> torch.Tensor:
    """Attention of q (B, H, N, D) over the union of its calls' keys (see the module)."""
    return KeySetUnion.apply(calls, scale, q, *sets)


def on_grid(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, n: int,
            calls: Callable[[torch.Tensor, torch.Tensor],
                            tuple[tuple[KeyCall, ...], tuple[torch.Tensor, ...]]]
            ) -> torch.Tensor:
    """q, k, v (B, H, T, D) on a grid of N >= T positions (the tail padded): ``calls(k, v)`` on
    the padded keys gives the calls and any key sets besides (k, v), source 0; -> (B, H, T, D)."""
    t = q.shape[-2]
    if n > t:
        q, k, v = (F.pad(x, (0, 0, 0, n - t)) for x in (q, k, v))
    chosen, extra = calls(k, v)
    return key_set_union(chosen, q, k, v, *extra, scale=q.shape[-1] ** -0.5)[:, :, :t]


__all__ = ["KeyCall", "Span", "fused_applies", "key_set_union", "on_grid"]
