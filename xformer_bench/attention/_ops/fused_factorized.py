"""The Sparse Transformer's merged patterns (Child et al. 2019, Eq. 7) on CPU as fused kernel
calls merged by log-sum-exp (:mod:`.key_set_union`): each part of the pattern is a few calls of
PyTorch's fused attention kernel over strided views of the (N / l, l) grid, so only the pairs
the pattern allows are scored (up to the kernel's blocks) and no scores are stored; a training
step holds full attention's memory.  A subclass says which calls (:meth:`fused_calls`).

It applies to causal, ``merged`` attention without an additive bias or key padding on a CPU
tensor (the LM training and evaluation case); everything else, and ``fused_on_cpu = False``,
takes the general path (grouped scores and one joint softmax, :mod:`.factorized`), which the
tests compare it with.
"""

from __future__ import annotations

import math

import torch

from xformer_bench.attention._ops.factorized import FactorizedAttention
from xformer_bench.attention._ops.key_set_union import KeyCall, fused_applies, on_grid


class FusedFactorized(FactorizedAttention):
    fused_on_cpu = True
    general_forward = FactorizedAttention.forward  # the path for everything else

    def fused_calls(self, k: torch.Tensor, v: torch.Tensor, width: int
                    ) -> tuple[tuple[KeyCall, ...], tuple[torch.Tensor, ...]]:
        """The calls over the padded grid of N = rows x ``width`` positions, and the key sets
        besides (k, v), source 0, that they read (sources 1, 2, ...)."""
        raise NotImplementedError

    def fused_forward(self, q, k, v, *, causal, bias=None, key_padding_mask=None, layer=0):
        """The fused forward where it applies, else the general one."""
        if not (self.mode == "merged"
                and fused_applies(self, q, k, causal, bias, key_padding_mask)):
            return self.general_forward(q, k, v, causal=causal, bias=bias,
                                        key_padding_mask=key_padding_mask, layer=layer)
        s = k.shape[-2]
        width = self.width(s)
        return on_grid(q, k, v, math.ceil(s / width) * width,
                       lambda k_, v_: self.fused_calls(k_, v_, width))


__all__ = ["FusedFactorized"]
