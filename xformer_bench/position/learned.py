"""Learned absolute position embeddings (Gehring et al. 2017; GPT).

A table of ``max_len`` rows (``data.seq_len`` when unset): a learned table cannot say
anything about positions it has no row for, so a table shorter than the model's input (when
built) or a longer input (when run) is a ConfigError that names the key to raise, not a
silent wrap-around.
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import POSITION


@POSITION.register("learned")
class LearnedPosition(Position):
    def __init__(self, dims: ModelDims, init_std: float = 0.02, max_len: int | None = None):
        super().__init__()
        rows = max_len or dims.seq_len
        if rows < dims.seq_len:
            raise ConfigError(f"position=learned has {rows} positions (position.max_len="
                              f"{max_len}), the model's input has {dims.seq_len}: set "
                              f"position.max_len={dims.seq_len} (or more), or null to follow "
                              "data.seq_len")
        self.table = nn.Parameter(torch.randn(rows, dims.d_model) * init_std)  # (max_len, D)
        self.max_positions = rows

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:  # (B, T, D)
        end = start + x.shape[1]  # rows at positions start .. end - 1
        if end > len(self.table):
            raise ConfigError(f"position=learned has {len(self.table)} positions, the input has "
                              f"{end}: set position.max_len={end} (or more)")
        return x + self.table[start:end]
