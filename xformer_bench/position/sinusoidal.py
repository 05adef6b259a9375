"""Fixed sinusoidal position encodings (Vaswani et al. 2017), divided by sqrt(D).

Vaswani et al. add the sinusoids to sqrt(D)-scaled embeddings; xbench's embeddings are not
scaled (their RMS is D^-1/2, see ``embedding/__init__.py``), so the sinusoids are divided by
sqrt(D) instead: the same input as the paper's, divided by sqrt(D), with the paper's ratio of
tokens to positions.
"""

from __future__ import annotations

import math

import torch

from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import POSITION


@POSITION.register("sinusoidal")
class SinusoidalPosition(Position):
    def __init__(self, dims: ModelDims, base: float = 10000.0):
        super().__init__()
        self.d_model, self.base = dims.d_model, base
        self.register_buffer("table", self.encodings(dims.seq_len), persistent=False)  # (T, D)

    def encodings(self, length: int) -> torch.Tensor:  # (length, D)
        d = self.d_model
        position = torch.arange(length).unsqueeze(1)  # (T, 1)
        freq = torch.exp(torch.arange(0, d, 2) * (-math.log(self.base) / d))  # (D/2,)
        table = torch.zeros(length, d)  # (T, D)
        table[:, 0::2] = torch.sin(position * freq)
        table[:, 1::2] = torch.cos(position * freq[: d // 2])
        return table / math.sqrt(d)

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:  # (B, T, D)
        end = start + x.shape[1]  # rows at positions start .. end - 1
        if end > len(self.table):  # past data.seq_len (evaluation, memory, decoding): grow once
            self.table = self.encodings(end).to(self.table.device)
        return x + self.table[start:end].to(x.dtype)
