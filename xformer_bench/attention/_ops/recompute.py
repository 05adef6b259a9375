"""Recomputation in the backward pass (Chen et al. 2016, "Training Deep Nets with Sublinear
Memory Cost"; PyTorch's non-reentrant ``torch.utils.checkpoint``) for the hand-written blocked
kernels.

A blocked kernel gathers each query block's keys and values (block + window rows of them) and
hands them to a fused attention call, which saves its inputs for the backward pass: a
training step then holds ``span / block`` copies of K and V per layer (about 3x at the default
windows) besides the projections' own, so the option allocated 1.2-1.7x full attention's step
memory although it computes a fraction of its pairs.  Under
:func:`recomputed` the kernel's forward keeps only q, k, v (as full attention's fused kernel
does) and its gathers and scores are recomputed, one layer at a time, when the backward pass
reaches it.  The price is one more forward of the kernel per step, a third of its cost.

Applies only where gradients are taken (training), not inside a block that
``model.checkpointing`` recomputes whole already, and not under ``torch.compile`` (a checkpoint
there breaks the graph; AOTAutograd's partitioner chooses what to recompute itself);
evaluation and decoding run the kernel directly.

Used by the windowed path of ``local``, ``block_local``, ``dilated`` and ``strided`` (a bias, key
padding, bidirectional attention, more keys than queries); causal training on CPU takes their
fused paths (:mod:`.fused_band`, :mod:`.fused_factorized`), which store nothing to recompute.
Not by the windowed path of ``longformer`` and ``bigbird``: its forward's own peak (the gathered
global and random blocks) keeps them at 1.6-2.2x full's memory either way, and recomputing
that forward cost them most of their speed-up.  ``kernel.recompute_in_backward = False`` turns it off (the tests measure
both).  Random draws in the forward are replayed exactly (the RNG state is restored for the
recomputation); a kernel whose forward is not a function of its inputs and that state cannot
use it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch.utils.checkpoint import checkpoint

from xformer_bench.core.recompute import block_recomputed


def recomputed(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps a kernel's ``forward(self, q, k, v, **options)``: when gradients are taken and
    ``self.recompute_in_backward`` (default True), its intermediates are recomputed in the
    backward pass instead of stored."""

    @functools.wraps(forward)
    def kernel(self, q, k, v, **options):
        wanted = torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v))
        if (not wanted or torch.compiler.is_compiling() or block_recomputed()
                or not getattr(self, "recompute_in_backward", True)):
            return forward(self, q, k, v, **options)
        return checkpoint(lambda q_, k_, v_: forward(self, q_, k_, v_, **options), q, k, v,
                          use_reentrant=False)

    return kernel


__all__ = ["recomputed"]
