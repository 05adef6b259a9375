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

from collections.abc import Mapping

import torch
from torch import nn

from xformer_bench.models.context import ForwardContext


class Stack(nn.Module):
    provides: frozenset[str] = frozenset()
    requires: Mapping[str, frozenset[str]] = {}
    blocks: nn.ModuleList
    """The blocks with parameters of their own, each once (a shared block is one entry)."""

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        raise NotImplementedError

    def report(self) -> dict[str, float]:
        """Learned or measured quantities for the run record (e.g. mean ponder steps)."""
        return {}
