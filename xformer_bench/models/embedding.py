"""Token embeddings, optionally factorised (ALBERT, Lan et al. 2020): a V x E table followed
by an E -> D projection, which saves parameters when E << D."""

from __future__ import annotations

import torch
from torch import nn


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, embedding_dim: int | None = None):
        super().__init__()
        factorised = embedding_dim is not None and embedding_dim != d_model
        self.table = nn.Embedding(vocab_size, embedding_dim if factorised else d_model)
        self.project = nn.Linear(embedding_dim, d_model, bias=False) if factorised else nn.Identity()

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        return self.project(self.table(tokens))
