"""Learned absolute position embeddings (Gehring et al. 2017; GPT)."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.models.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import POSITION


@POSITION.register("learned")
class LearnedPosition(Position):
    def __init__(self, dims: ModelDims, init_std: float = 0.02):
        super().__init__()
        self.table = nn.Parameter(torch.randn(dims.seq_len, dims.d_model) * init_std)  # (T, D)

    def embed(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        return x + self.table[: x.shape[1]]
