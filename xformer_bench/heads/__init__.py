"""Output heads: the final hidden state (B, T, D) -> a distribution over the vocabulary.

Builders take the model's ``embedding`` (:mod:`xformer_bench.embedding`: a tied head shares
its tables) and ``d_model`` plus the keys of their YAML (``conf/head/<name>.yaml``).  Every
head gives

* ``head(h)`` -- log-probabilities (B, T, V) of the whole vocabulary, exactly (sampling,
  beam search, cached decoding);
* ``head.loss(h, targets, ...)`` -- the next-token cross-entropy the tasks train and evaluate
  on.  The head owns it: the adaptive softmax scores only the clusters its targets fall in
  and never builds the (B, T, V) distribution.  The default (:meth:`OutputHead.loss`) is
  ``F.cross_entropy`` on ``head(h)``, exact since ``log_softmax(log p) = log p`` for a
  normalised ``p``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.embedding import Embedding
from xformer_bench.errors import ConfigError


class OutputHead(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, V) log-probs
        raise NotImplementedError

    def loss(self, h: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
             reduction: str = "mean", label_smoothing: float = 0.0) -> torch.Tensor:
        """Cross-entropy in nats of ``targets`` (B, T) under ``self(h)``, ``F.cross_entropy``'s
        options and reductions (mean over the targets other than ``ignore_index``, sum, or
        per token (B * T,) with ``reduction="none"``)."""
        return F.cross_entropy(self(h).flatten(0, 1).float(), targets.flatten(),
                               ignore_index=ignore_index, reduction=reduction,
                               label_smoothing=label_smoothing)


def single_table(embedding: Embedding, head: str) -> nn.Embedding:
    """The one table a tied ``head`` shares; a ConfigError for an embedding with several."""
    tables = embedding.tables()
    if len(tables) != 1:
        raise ConfigError(f"head={head} head.tie=true shares one V x E input table, and the "
                          f"embedding has {len(tables)} (one per cluster); choose another head "
                          "or embedding, or set head.tie=false")
    return tables[0][1]


def vocabulary(embedding: Embedding, d_model: int, tie: bool,
               head: str) -> tuple[nn.Module, nn.Linear]:
    """``(unproject, vocab)``: logits of states h are ``vocab(unproject(h))``.  ``vocab`` is the
    E x V output matrix -- the input table itself when tied (Press & Wolf 2017); ``unproject``
    maps D back to the table's width E when it is factorised (ALBERT's output layer, Lan et
    al. 2020: a D -> E matrix of its own, not the transpose of the embedding's projection),
    else the identity.  Untied, the output matrix is D x V whatever the embedding."""
    table = single_table(embedding, head) if tie else None
    width = table.embedding_dim if tie else d_model
    unproject = nn.Linear(d_model, width, bias=False) if width != d_model else nn.Identity()
    vocab = nn.Linear(width, vocab_size(embedding), bias=False)
    if tie:
        vocab.weight = table.weight
    return unproject, vocab


def vocab_size(embedding: Embedding) -> int:
    """V, the ids the embedding covers."""
    start, last = embedding.tables()[-1]
    return start + last.num_embeddings
