"""Fixed sinusoidal position encodings (Vaswani et al. 2017), divided by sqrt(D).

Vaswani et al. add the sinusoids to sqrt(D)-scaled embeddings; xbench's embeddings are not
scaled (their RMS is D^-1/2, see ``models/embedding.py``), so the sinusoids are divided by
sqrt(D) instead: the same input as the paper's, divided by sqrt(D), with the paper's ratio of
tokens to positions.
"""

from __future__ import annotations

import math

import torch

from xformer_bench.models.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import POSITION


@POSITION.register("sinusoidal")
class SinusoidalPosition(Position):
    def __init__(self, dims: ModelDims, base: float = 10000.0):
        super().__init__()
        position = torch.arange(dims.seq_len).unsqueeze(1)  # (T, 1)
        freq = torch.exp(torch.arange(0, dims.d_model, 2) * (-math.log(base) / dims.d_model))
        table = torch.zeros(dims.seq_len, dims.d_model)  # (T, D)
        table[:, 0::2] = torch.sin(position * freq)
        table[:, 1::2] = torch.cos(position * freq[: dims.d_model // 2])
        self.register_buffer("table", table / math.sqrt(dims.d_model), persistent=False)

    def embed(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        return x + self.table[: x.shape[1]]
