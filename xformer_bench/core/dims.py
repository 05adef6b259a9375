"""The sizes every component is built from."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

from xformer_bench.errors import ConfigError

POSITIVE_SIZES = {"d_model": "model.d_model", "n_heads": "model.n_heads",
                  "n_layers": "model.n_layers", "d_ff": "model.d_ff", "seq_len": "data.seq_len"}
"""The sizes that must be positive integers, and the config key each comes from."""


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
        for field, key in POSITIVE_SIZES.items():
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ConfigError(f"{key}={value} must be a positive integer")
        if self.d_model % self.n_heads:
            divisors = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            raise ConfigError(
                f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}: "
                f"choose model.n_heads among {', '.join(map(str, divisors))}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads
