"""Output layers mapping the final hidden state to next-token log-probabilities.

* ``softmax`` -- one linear map to the vocabulary, optionally tied to the input embedding's
  table (Press & Wolf 2017).  When the embedding is factorised (V x E table, E -> D
  projection), the head first maps D -> E with its own matrix ``unproject`` (not the
  transpose of the embedding's projection) and then applies the E x V table, as ALBERT's
  output layer does (Lan et al. 2020).  (T5's E^-1/2 logit rescaling for tied heads was
  measured here, with the earlier unit-scale embeddings, to slow early learning on real text:
  3.87 against 3.53 bpb after 150 steps, so it is not applied.)
* ``mixture_of_softmaxes`` -- Yang et al. 2018: ``p = sum_k pi_k softmax(h_k W)`` with
  ``h_k = tanh(P_k h)``, which lifts the softmax bottleneck's rank limit.

Both return log-probabilities (B, T, V); cross-entropy on them is exact since
``log_softmax(log p) = log p`` for a normalised ``p``.
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.models.embedding import TokenEmbedding

OUTPUTS = ("softmax", "mixture_of_softmaxes")


class OutputHead(nn.Module):
    def __init__(self, embedding: TokenEmbedding, d_model: int, tie: bool = True,
                 kind: str = "softmax", components: int = 4):
        super().__init__()
        if kind not in OUTPUTS:
            raise ConfigError(f"model.output={kind!r}; choose one of: {', '.join(OUTPUTS)}")
        vocab_size, width = embedding.table.num_embeddings, embedding.table.embedding_dim
        self.components = components if kind == "mixture_of_softmaxes" else 1
        if self.components > 1:
            self.prior = nn.Linear(d_model, self.components, bias=False)
            self.contexts = nn.Linear(d_model, self.components * d_model)
        # back to the embedding width when the embedding is factorised
        self.unproject = (nn.Linear(d_model, width, bias=False) if width != d_model
                          else nn.Identity())
        self.vocab = nn.Linear(width, vocab_size, bias=False)
        if tie:
            self.vocab.weight = embedding.table.weight

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, V) log-probs
        if self.components == 1:
            return self.vocab(self.unproject(h)).log_softmax(-1)
        b, t, d = h.shape
        contexts = torch.tanh(self.contexts(h)).view(b, t, self.components, d)  # (B, T, K, D)
        log_p = self.vocab(self.unproject(contexts)).log_softmax(-1)  # (B, T, K, V)
        log_prior = self.prior(h).log_softmax(-1).unsqueeze(-1)  # (B, T, K, 1)
        return torch.logsumexp(log_prior + log_p, dim=2)  # (B, T, V)
