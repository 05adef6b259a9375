"""``softmax``: one linear map to the vocabulary and a softmax (Vaswani et al. 2017, section
3.4), ``log p(w | h) = log_softmax(h W)_w``; ``tie`` shares W with the input table (Press &
Wolf 2017), through a D -> E map of its own when the embedding is factorised (ALBERT).

(T5's E^-1/2 logit rescaling for tied heads was measured here, with the earlier unit-scale
embeddings, to slow early learning on real text: 3.87 against 3.53 bpb after 150 steps, so it
is not applied.)"""

from __future__ import annotations

import torch

from xformer_bench.embedding import Embedding
from xformer_bench.heads import OutputHead, vocabulary
from xformer_bench.registry import HEAD


class SoftmaxHead(OutputHead):
    def __init__(self, embedding: Embedding, d_model: int, tie: bool = True):
        super().__init__()
        self.unproject, self.vocab = vocabulary(embedding, d_model, tie, "softmax")

    def forward(self, h: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, V) log-probs
        return self.vocab(self.unproject(h)).log_softmax(-1)


@HEAD.register("softmax")
def build(embedding: Embedding, d_model: int, tie: bool) -> SoftmaxHead:
    return SoftmaxHead(embedding, d_model, tie)
