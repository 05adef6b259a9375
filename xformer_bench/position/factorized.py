"""Factorized learned position embeddings (Child, Gray, Radford & Sutskever 2019, "Generating
Long Sequences with Sparse Transformers", section 5.2/7): one full-width learned table per axis
of the data's layout, summed,

    E[i] = E_1[i_1] + E_2[i_2] (+ E_3[i_3]),

e.g. ``shape: [32, 32, 3]`` (row, column, channel) for CIFAR-10's 3072 sub-pixels, or, for 1-D
data, a 2-D grid matching the factorized attention pattern (``shape: null``: a near-square
grid for ``data.seq_len``, the stride of the strided pattern; the paper found embeddings that
"encoded the structure of the data or the factorized attention patterns" important).
A longer input than the grid covers is a one-line error naming ``position.shape``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.position._axes import coordinates, grid_shape
from xformer_bench.registry import POSITION


@POSITION.register("factorized")
class FactorizedPosition(Position):
    def __init__(self, dims: ModelDims, shape: list[int] | None = None, init_std: float = 0.02):
        super().__init__()
        self.grid = grid_shape(shape, dims.seq_len, "factorized")
        self.max_positions = math.prod(self.grid)
        self.tables = nn.ParameterList(
            nn.Parameter(torch.randn(n, dims.d_model) * init_std) for n in self.grid)

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:  # (B, T, D)
        coords = coordinates(start + x.shape[1], self.grid, "factorized", x.device)
        coords = [c[start:] for c in coords]  # (T,) each: the rows' positions start ..
        return x + sum(table[c] for table, c in zip(self.tables, coords))
