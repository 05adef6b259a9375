"""One softmax over several groups of keys without concatenating them (Child et al. 2019's
merged pattern, Eq. 7, in :mod:`xformer_bench.attention._ops.factorized`): each group's partial
softmax and log-normaliser, merged exactly; backward is softmax attention's.  A *part* is any
object with ``ungroup`` / ``regroup`` between its (B, H, G, gq, .) groups and (B, H, N, .)
positions (:class:`xformer_bench.attention._ops.factorized.Part`)."""

from __future__ import annotations

import functools

import torch


class JointSoftmax(torch.autograd.Function):
    """``sum_p ungroup_p(P_p @ V_p)``, the P_p one softmax over two or more parts' scores per
    query, without concatenating them: each part takes its own softmax S_p and log-normaliser
    L_p, and P_p = w_p S_p with w_p = exp(L_p - logsumexp_p L_p) per query (the exact merge of
    partial softmaxes).  Backward is softmax attention's, dS = P (dP - rowsum(dO * O)).  Each
    pass over the scores is a fused softmax or in place: memory traffic is these kernels' cost."""

    @staticmethod
    def forward(ctx, parts: tuple, *tensors: torch.Tensor) -> torch.Tensor:
        scores, values = tensors[:len(parts)], tensors[len(parts):]  # (B, H, G, gq, gk|D)
        probs, outs, lses = [], [], []
        for part, s, v in zip(parts, scores, values):
            p = s.softmax(-1, dtype=torch.float32)  # (B, H, G, gq, gk): S_p
            top, at = s.float().max(-1, keepdim=True)  # (B, H, G, gq, 1): L = s_j - log p_j
            lses.append(part.ungroup(top - p.gather(-1, at).log()))  # (B, H, N, 1)
            outs.append(part.ungroup(p.to(v.dtype) @ v))  # (B, H, N, D)
            probs.append(p)
        lses = torch.stack(lses)  # (P, B, H, N, 1)
        weights = (lses - lses.logsumexp(0)).exp().unbind(0)  # (B, H, N, 1) each
        out = functools.reduce(torch.add, [w.to(o.dtype) * o for w, o in zip(weights, outs)])
        ctx.parts = parts
        ctx.save_for_backward(out, *probs, *values, *weights)
        return out  # (B, H, N, D)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        n = len(ctx.parts)
        out, *saved = ctx.saved_tensors
        probs, values, weights = saved[:n], saved[n:2 * n], saved[2 * n:]
        grad = grad.contiguous()  # (B, H, N, D)
        drift = (grad * out).sum(-1, keepdim=True).float()  # (B, H, N, 1): rowsum(dO * O)
        d_scores, d_values = [], []
        for part, p, v, w in zip(ctx.parts, probs, values, weights):
            g = part.regroup(grad * w.to(grad.dtype))  # (B, H, G, gq, D): dO w_p
            d_p = (g @ v.transpose(-1, -2)).float()  # (B, H, G, gq, gk)
            d_scores.append(d_p.sub_(part.regroup(w * drift)).mul_(p))  # w S (dP - D)
            d_values.append(p.to(g.dtype).transpose(-1, -2) @ g)  # (B, H, G, gk, D)
        return (None, *d_scores, *d_values)
