"""``factorized``: ALBERT's factorised embedding (Lan et al. 2020, section 3.1): a V x E table
then an E -> D projection, ``x_t = P E[w_t]``, V*E + E*D parameters instead of V*D (fewer when
E << D).  A tied head maps D -> E with its own matrix, then scores with the E x V table
(:mod:`xformer_bench.heads`), as ALBERT's output layer does."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.embedding import Embedding, init_projection, init_table
from xformer_bench.errors import ConfigError
from xformer_bench.registry import EMBEDDING


class FactorizedEmbedding(Embedding):
    def __init__(self, vocab_size: int, d_model: int, dim: int):
        super().__init__()
        self.table = nn.Embedding(vocab_size, dim)  # (V, E)
        self.project = nn.Linear(dim, d_model, bias=False)  # E -> D
        init_table(self.table), init_projection(self.project)

    def tables(self) -> list[tuple[int, nn.Embedding]]:
        return [(0, self.table)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        return self.project(self.table(tokens))


@EMBEDDING.register("factorized")
def build(vocab_size: int, d_model: int, dim: int) -> FactorizedEmbedding:
    if dim < 1:
        raise ConfigError(f"embedding.dim={dim}: a factorised table needs a positive width "
                          f"(it saves parameters below model.d_model={d_model})")
    return FactorizedEmbedding(vocab_size, d_model, dim)
