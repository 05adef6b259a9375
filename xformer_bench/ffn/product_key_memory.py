"""Product-key memory in place of the feed-forward layer (Lample et al. 2019, "Large Memory
Layers with Product Keys").

A memory of ``num_keys ** 2`` value vectors is addressed by keys that are the concatenations
``[c_i ; c'_j]`` of two sets of ``num_keys`` sub-keys.  A query split in halves ``[q1 ; q2]``
scores key (i, j) as ``q1 . c_i + q2 . c'_j``, so the ``topk`` best of all ``num_keys ** 2``
keys are among the ``topk x topk`` pairs of the ``topk`` best sub-keys of each half: the exact
top-k costs ``2 num_keys`` dot products instead of ``num_keys ** 2``.  Their scores are
softmaxed and the output is the weighted sum of their values.  Each of ``heads`` heads has its
own query and sub-keys; all read the same values and their outputs are summed.

Differences from the paper: the query network is one linear map, without the batch norm of
the paper (batch statistics would mix future tokens into the present in training), and the
memory replaces the feed-forward sublayer of every block.  The layer has no activation, so
the ``activation`` config is not used.  Each token reads its own memory slots: the layer is
causal in training and eval alike.
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import mark_initialised
from xformer_bench.registry import FFN


class ProductKeyMemory(nn.Module):
    def __init__(self, dims: ModelDims, num_keys: int, heads: int, topk: int, key_dim: int):
        super().__init__()
        if key_dim % 2:
            raise ValueError(f"ffn.key_dim={key_dim} must be even: the query is split in halves")
        if not 1 <= topk <= num_keys:
            raise ValueError(f"ffn.topk={topk} must be between 1 and ffn.num_keys={num_keys}")
        self.num_keys, self.heads, self.topk, self.key_dim = num_keys, heads, topk, key_dim
        self.query = nn.Linear(dims.d_model, heads * key_dim)
        self.sub_keys = nn.Parameter(torch.empty(heads, 2, num_keys, key_dim // 2))
        self.values = nn.EmbeddingBag(num_keys**2, dims.d_model, mode="sum")
        self.reset_parameters(dims.d_model)

    @torch.no_grad()
    def reset_parameters(self, d_model: int) -> None:
        """The authors' scales, kept from the model-wide default (marked):

        * sub-keys uniform in +-(key_dim/2)^-1/2, "the same initialisation as nn.Linear" in
          the authors' code;
        * values N(0, d^-1/2), as in the authors' code;
        * query weights N(0, d^-1/2), biases 0: on a normalised input (unit RMS) the queries
          then start at unit variance, the scale the paper's query batch norm gives them.
        """
        bound = (self.key_dim // 2) ** -0.5
        nn.init.uniform_(self.sub_keys, -bound, bound)
        nn.init.normal_(self.values.weight, std=d_model ** -0.5)
        nn.init.normal_(self.query.weight, std=d_model ** -0.5)
        nn.init.zeros_(self.query.bias)
        mark_initialised(self.values.weight, self.query.weight, self.query.bias)

    @property
    def memory_size(self) -> int:
        return self.num_keys**2

    def lookup(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # x: (N, D)
        """Scores and memory indices of each head's ``topk`` best keys, both (N, heads, topk)."""
        q = self.query(x).view(len(x), self.heads, 2, self.key_dim // 2)  # (N, H, 2, Dk/2)
        with torch.autocast(x.device.type, enabled=False):  # keys chosen in float32 (bf16 ties)
            sub_scores = torch.einsum("nhsd,hskd->nhsk", q.float(), self.sub_keys.float())
        best, index = sub_scores.topk(self.topk, dim=-1)  # (N, H, 2, k) each
        pair_scores = best[:, :, 0, :, None] + best[:, :, 1, None, :]  # (N, H, k, k)
        pair_index = index[:, :, 0, :, None] * self.num_keys + index[:, :, 1, None, :]  # (N, H, k, k)
        scores, chosen = pair_scores.flatten(2).topk(self.topk, dim=-1)  # (N, H, k) each
        return scores, pair_index.flatten(2).gather(-1, chosen)  # (N, H, k) each

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        tokens = x.reshape(-1, x.shape[-1])  # (N, D)
        scores, index = self.lookup(tokens)  # (N, H, k) each
        weights = scores.float().softmax(-1).to(self.values.weight.dtype)  # (N, H, k)
        out = self.values(index.flatten(1), per_sample_weights=weights.flatten(1))  # (N, D)
        return out.view_as(x)

    def inactive_parameters(self) -> int:
        """Value rows a token does not read.  Approximation: it reads ``heads * topk`` rows,
        counted as distinct although heads may pick the same slot; queries and sub-keys are
        all used to score."""
        read = min(self.memory_size, self.heads * self.topk)
        return (self.memory_size - read) * self.values.embedding_dim


@FFN.register("product_key_memory")
def build(dims: ModelDims, activation: Mapping[str, Any], num_keys: int = 32, heads: int = 4,
          topk: int = 8, key_dim: int = 64) -> ProductKeyMemory:
    return ProductKeyMemory(dims, num_keys=num_keys, heads=heads, topk=topk, key_dim=key_dim)
