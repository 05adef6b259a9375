"""The ``stack`` group: how the model applies its blocks, ``(B, T, D) -> (B, T, D)``.

A registered builder takes ``dims``, ``make_block`` (a factory of the model's
:class:`~xformer_bench.models.block.Block`), ``share_blocks`` and ``checkpointing`` (the model's
keys), plus the keys of its YAML, and returns a :class:`Stack`.  The stack owns the blocks
(``stack.blocks``: each block with parameters of its own, once) and the loop over depth, so
mechanisms that change the loop -- reversible residuals, adaptive depth, skipped layers,
memory across segments -- are one file each and compose with every token mixer, norm and
feed-forward.  ``standard`` is the Transformer's: one block after another.

A stack sets ``ctx.layer`` before each block (the parameter layer: 0 for every application of
a shared block) and may add auxiliary losses (ponder cost, budget) through ``ctx``.  Like the
other parts it declares ``provides`` / ``requires`` (:mod:`xformer_bench.models.capabilities`);
what it needs of a block's structure (pre-norm placement, plain residual adds) it checks when
built, one ``ConfigError`` line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from xformer_bench.core.context import ForwardContext
from xformer_bench.core.recompute import enter_recomputed_block, leave


class BlockFactory:
    """``make_block()``: a new block of the model (what every stack calls).  A stack that
    builds cells of its own reads the rest: ``make_norm()`` (a new norm of the model's option)
    a width of its own: ``make_norm(dim)``) and ``decoder`` (whether the blocks serve a causal decoder; the Evolved Transformer's
    encoder and decoder cells differ)."""

    def __init__(self, make: Callable[[], nn.Module], make_norm: Callable[[], nn.Module],
                 decoder: bool):
        self.make, self.make_norm, self.decoder = make, make_norm, decoder

    def __call__(self) -> nn.Module:
        return self.make()


class Stack(nn.Module):
    provides: frozenset[str] = frozenset()
    requires: Mapping[str, frozenset[str]] = {}
    blocks: nn.ModuleList
    """The blocks with parameters of their own, each once (a shared block is one entry)."""
    shares_blocks: bool = False
    """True: one block serves several depths whatever ``model.share_blocks`` says (the Universal
    Transformer), so parts keeping per-layer statistics are refused."""

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        raise NotImplementedError

    def report(self) -> dict[str, float]:
        """Learned or measured quantities for the run record (e.g. mean ponder steps)."""
        return {}


def _apply(block: nn.Module, x: torch.Tensor, ctx: ForwardContext, layer: int,
           fields: dict[str, Any], checkpointed: bool = False) -> torch.Tensor:
    ctx.layer = layer
    for name, value in fields.items():
        setattr(ctx, name, value)
    marked = enter_recomputed_block() if checkpointed and not torch.compiler.is_compiling() \
        else None
    try:
        return block(x, ctx)  # (B, T, D)
    finally:
        if marked is not None:
            leave(marked)
        for name in fields:
            setattr(ctx, name, None)


def apply_block(block: nn.Module, x: torch.Tensor, ctx: ForwardContext, layer: int, *,
                recompute: bool = False, **fields: Any) -> torch.Tensor:
    """``block(x, ctx)`` as the application at parameter layer ``layer``, with the context
    ``fields`` set for it (e.g. ``memory=``) and cleared after; its output is appended to
    ``ctx.layer_states`` when that is a list.  With ``recompute`` the block is
    checkpointed (Chen et al. 2016): the layer index and fields are arguments, so the backward
    pass recomputes it with the same ones, not with whatever ``ctx`` holds by then."""
    if recompute:
        x = checkpoint(_apply, block, x, ctx, layer, fields, True, use_reentrant=False)
    else:
        x = _apply(block, x, ctx, layer, fields)
    if ctx.layer_states is not None:  # transparent attention reads every layer's output
        ctx.layer_states.append(x)
    return x


def recomputes(stack: nn.Module) -> bool:
    """Whether this forward checkpoints its blocks: ``model.checkpointing`` whenever a backward
    pass may follow (training; also the step-memory and FLOP probes, which run in eval mode so
    that nothing stateful moves); never under ``no_grad`` (evaluation)."""
    return bool(getattr(stack, "checkpointing", False)) and torch.is_grad_enabled()
