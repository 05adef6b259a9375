"""``lookup``: one V x D table (Vaswani et al. 2017, section 3.4): ``x_t = E[w_t]``."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.embedding import Embedding, init_table
from xformer_bench.registry import EMBEDDING


class LookupEmbedding(Embedding):
    def __init__(self, vocab_size: int, d_model: int):
        super().__init__()
        self.table = init_table(nn.Embedding(vocab_size, d_model))  # (V, D)

    def tables(self) -> list[tuple[int, nn.Embedding]]:
        return [(0, self.table)]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        return self.table(tokens)


@EMBEDDING.register("lookup")
def build(vocab_size: int, d_model: int) -> LookupEmbedding:
    return LookupEmbedding(vocab_size, d_model)
