"""``mixture_of_softmaxes``: Yang et al. 2018 ("Breaking the softmax bottleneck"), which
lifts the softmax bottleneck's rank limit:

    p(w | h) = sum_k pi_k softmax(h_k W)_w,   h_k = tanh(P_k h + b_k),   pi = softmax(h U),

K contexts sharing the output matrix W (tied or not, as :mod:`.softmax`)."""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.embedding import Embedding
from xformer_bench.heads import OutputHead, vocabulary
from xformer_bench.registry import HEAD


class MixtureOfSoftmaxes(OutputHead):
    def __init__(self, embedding: Embedding, d_model: int, tie: bool, components: int):
        super().__init__()
        self.components = components
        self.prior = nn.Linear(d_model, components, bias=False)  # U
        self.contexts = nn.Linear(d_model, components * d_model)  # P_k, b_k
        self.unproject, self.vocab = vocabulary(embedding, d_model, tie, "mixture_of_softmaxes")

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, V) log-probs
        b, t, d = h.shape
        contexts = torch.tanh(self.contexts(h)).view(b, t, self.components, d)  # (B, T, K, D)
        log_p = self.vocab(self.unproject(contexts)).log_softmax(-1)  # (B, T, K, V)
        log_prior = self.prior(h).log_softmax(-1).unsqueeze(-1)  # (B, T, K, 1)
        return torch.logsumexp(log_prior + log_p, dim=2)  # (B, T, V)


@HEAD.register("mixture_of_softmaxes")
def build(embedding: Embedding, d_model: int, tie: bool, components: int) -> MixtureOfSoftmaxes:
    return MixtureOfSoftmaxes(embedding, d_model, tie, components)
