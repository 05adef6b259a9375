"""One Transformer layer: attention and feed-forward sublayers, each with a residual
connection and a norm placed before (pre-LN) or after (post-LN) it."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.position import Position

PLACEMENTS = ("pre", "post")


class Block(nn.Module):
    def __init__(
        self,
        attention: nn.Module,
        feedforward: nn.Module,
        make_norm: Callable[[], nn.Module],
        placement: str = "pre",
        dropout: float = 0.0,
    ):
        super().__init__()
        if placement not in PLACEMENTS:
            raise ValueError(f"model.norm_placement={placement!r}; choose one of {PLACEMENTS}")
        self.pre = placement == "pre"
        self.attention = attention
        self.feedforward = feedforward
        self.norm_attention = make_norm()
        self.norm_feedforward = make_norm()
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, position: Position) -> torch.Tensor:  # (B, T, D)
        if self.pre:
            x = x + self.dropout(self.attention(self.norm_attention(x), position))
            return x + self.dropout(self.feedforward(self.norm_feedforward(x)))
        x = self.norm_attention(x + self.dropout(self.attention(x, position)))
        return self.norm_feedforward(x + self.dropout(self.feedforward(x)))
