"""Decoder-only Transformer language model assembled from registered components.

``forward`` scores a whole sequence; ``decode`` continues one from a key/value cache
(incremental decoding, :mod:`xformer_bench.core.decode_cache`): only ``stack=standard`` with
cacheable attention can (``cached_decoding.cache_blocker`` says why not); the others are decoded by
recomputing the window (:mod:`xformer_bench.sample`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.models.body import Assembly, build_body, initialise
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.registry import EMBEDDING, HEAD

class TransformerLM(Assembly):
    def __init__(
        self,
        dims: ModelDims,
        attention: Mapping[str, Any],
        norm: Mapping[str, Any],
        activation: Mapping[str, Any],
        position: Mapping[str, Any],
        ffn: Mapping[str, Any] = {"name": "dense"},  # noqa: B006 -- read-only
        stack: Mapping[str, Any] = {"name": "standard"},  # noqa: B006 -- read-only
        embedding: Mapping[str, Any] = {"name": "lookup"},  # noqa: B006 -- read-only
        head: Mapping[str, Any] = {"name": "softmax", "tie": True},  # noqa: B006 -- read-only
        norm_placement: str = "pre",
        share_blocks: bool = False,
        residual: str = "add",
        residual_attention: bool = False,
        checkpointing: bool = False,
        hybrid: Mapping[str, Any] | None = None,
    ):
        super().__init__()
        self.dims = dims
        self.embedding = EMBEDDING.build(embedding, vocab_size=dims.vocab_size,
                                         d_model=dims.d_model)
        self.position, self.stack, self.final_norm, _ = build_body(
            dims, attention, norm, activation, position, ffn, stack,
            norm_placement=norm_placement, share_blocks=share_blocks, residual=residual,
            residual_attention=residual_attention, checkpointing=checkpointing, hybrid=hybrid)
        self.dropout = nn.Dropout(dims.dropout)
        self.share_blocks = share_blocks
        self.head = HEAD.build(head, embedding=self.embedding, d_model=dims.d_model)
        self._auxiliary_loss: torch.Tensor | None = None
        initialise(self, dims, self.stack)

    def hidden(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, D)
        """The final states the head reads, one per position of ``tokens``."""
        ctx = ForwardContext(self.position, causal=True)
        x = self.dropout(self.position.embed(self.embedding(tokens)))  # (B, T, D)
        x = self.final_norm(self.stack(x, ctx))  # (B, T, D)
        self._auxiliary_loss = ctx.auxiliary_loss()
        return x

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                **loss: Any) -> torch.Tensor:
        """Log-probs (B, T, V) of the token after each prefix of ``tokens`` (B, T); given
        ``targets`` (B, T), the head's cross-entropy of them instead (``head.loss`` with the
        options ``loss``), which need not build the (B, T, V) distribution."""
        x = self.hidden(tokens)  # (B, T, D)
        return self.head(x) if targets is None else self.head.loss(x, targets, **loss)

    def decode(self, tokens: torch.Tensor, cache: DecodeCache) -> torch.Tensor:
        """Log-probs (B, T, V) of ``tokens`` (B, T), the positions after the ``cache.length``
        already in ``cache``, which they extend: ``forward`` of the whole sequence, last T rows
        (up to float rounding), for a model :func:`cache_blocker` allows -- checked by the caller
        once, not here.  Positions continue at ``cache.length`` (an absolute scheme's limit
        applies: learned positions end at their table)."""
        cache.begin_step(tokens.shape[1])
        ctx = ForwardContext(self.position, causal=True, cache=cache)
        x = self.dropout(self.position.embed(self.embedding(tokens), start=cache.start))
        x = self.stack(x, ctx)  # (B, T, D)
        self._auxiliary_loss = ctx.auxiliary_loss()
        return self.head(self.final_norm(x))
