"""Feed-forward layers, chosen by their activation.  Builders take ``dims`` plus the keys
of their YAML and return a module mapping (B, T, D) -> (B, T, D)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.models.dims import ModelDims


class FeedForward(nn.Module):
    """``W2 act(W1 x)``: the position-wise feed-forward layer of the Transformer."""

    def __init__(self, dims: ModelDims, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.up = nn.Linear(dims.d_model, dims.d_ff)
        self.down = nn.Linear(dims.d_ff, dims.d_model)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        return self.down(self.act(self.up(x)))
