"""The Transformer's stack: ``n_layers`` blocks, one after another (Vaswani et al. 2017), or one
block applied ``n_layers`` times with ``model.share_blocks`` (Dehghani et al. 2019; Lan et al.
2020).  ``model.checkpointing`` recomputes each block in the backward pass (Chen et al. 2016,
the Sparse Transformer's recompute): only block inputs are kept."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import STACK
from xformer_bench.stacks import Stack, apply_block, recomputes


@STACK.register("standard")
class StandardStack(Stack):
    provides = frozenset({"ordered_blocks"})

    def __init__(self, dims: ModelDims, make_block: Callable[[], nn.Module],
                 share_blocks: bool = False, checkpointing: bool = False):
        super().__init__()
        self.n_layers, self.share_blocks, self.checkpointing = (
            dims.n_layers, share_blocks, checkpointing)
        self.blocks = nn.ModuleList(make_block() for _ in range(1 if share_blocks else dims.n_layers))

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        recompute = recomputes(self)
        for i in range(self.n_layers):
            layer = 0 if self.share_blocks else i
            x = apply_block(self.blocks[layer], x, ctx, layer, recompute=recompute)
        return x
