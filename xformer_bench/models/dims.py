"""The sizes every component is built from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelDims:
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    seq_len: int
    vocab_size: int
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads
