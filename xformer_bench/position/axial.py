"""Axial position embeddings (Kitaev, Kaiser & Levskaya 2020, "Reformer", ICLR; section 5's
models, the ``AxialPositionalEncoding`` of its trax code, described in Ho et al. 2019).

A learned table of ``T x D`` parameters is replaced by one table per axis of a grid covering
the positions, ``shape = (n_1, n_2)`` with ``n_1 n_2 >= T``, each of width ``d_j`` with
``d_1 + d_2 = D``; position ``i = (i_1, i_2)`` gets the concatenation

    E[i] = [E_1[i_1] ; E_2[i_2]]      (D values from n_1 d_1 + n_2 d_2 parameters),

added to the token embedding.  For enwik8's 64K positions Reformer used shape (128, 512).
``shape: null`` is a near-square grid for ``data.seq_len``; ``dims: null`` splits D in halves.
Any number of axes works (``shape: [a, b, c]`` with three ``dims``).  A longer input than the
grid covers is a one-line error naming ``position.shape``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.position._axes import coordinates, grid_shape
from xformer_bench.registry import POSITION


@POSITION.register("axial")
class AxialPosition(Position):
    def __init__(self, dims: ModelDims, shape: list[int] | None = None,
                 dims_per_axis: list[int] | None = None, init_std: float = 0.02):
        super().__init__()
        self.grid = grid_shape(shape, dims.seq_len, "axial")
        self.max_positions = math.prod(self.grid)
        widths = dims_per_axis or _even_split(dims.d_model, len(self.grid))
        if len(widths) != len(self.grid) or sum(widths) != dims.d_model or min(widths) < 1:
            raise ConfigError(f"position.dims_per_axis={list(widths)} must give each of the "
                              f"{len(self.grid)} axes a positive width summing to "
                              f"model.d_model={dims.d_model}")
        self.tables = nn.ParameterList(
            nn.Parameter(torch.randn(n, d) * init_std) for n, d in zip(self.grid, widths))

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:  # (B, T, D)
        coords = coordinates(start + x.shape[1], self.grid, "axial", x.device)
        coords = [c[start:] for c in coords]  # (T,) each: the rows' positions start ..
        return x + torch.cat([table[c] for table, c in zip(self.tables, coords)], dim=-1)


def _even_split(d_model: int, parts: int) -> list[int]:
    base = d_model // parts
    return [base + (1 if j < d_model - base * parts else 0) for j in range(parts)]
