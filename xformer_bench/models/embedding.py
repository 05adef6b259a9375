"""Token embeddings, optionally factorised (ALBERT, Lan et al. 2020): a V x E table followed
by an E -> D projection, which saves parameters when E << D.

Scale.  Vaswani et al. (2017, section 3.4) multiply the embeddings by sqrt(D) and add
sinusoids of amplitude 1, so tokens and positions have unit scale.  xbench keeps that ratio
but divides the whole input by sqrt(D): the table is N(0, 1/D) and *not* multiplied, and the
sinusoidal positions are divided by sqrt(D) (``position/sinusoidal.py``).  In a pre-LN stack
the initial scale of the residual stream decides how much the first updates of the blocks
change it: at unit scale the blocks' contributions started ~30x smaller than the stream, and
on real text (issue 7: d_model 256, 4 layers, 400 steps) the model ended 0.15 bits per byte
behind the same model with a D^-1/2 stream.  Factorised or not, token vectors start at
RMS D^-1/2: table N(0, 1/E), projection N(0, 1/D), so each output coordinate has variance
E * (1/E) * (1/D) = 1/D.  The tied output head then starts with unit-scale logits.
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.models.init import mark_initialised


class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, d_model: int, embedding_dim: int | None = None):
        super().__init__()
        factorised = embedding_dim is not None and embedding_dim != d_model
        self.table = nn.Embedding(vocab_size, embedding_dim if factorised else d_model)
        self.project = nn.Linear(embedding_dim, d_model, bias=False) if factorised else nn.Identity()
        nn.init.normal_(self.table.weight, std=self.table.embedding_dim ** -0.5)
        mark_initialised(self.table.weight)
        if factorised:
            nn.init.normal_(self.project.weight, std=d_model ** -0.5)
            mark_initialised(self.project.weight)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        return self.project(self.table(tokens))
