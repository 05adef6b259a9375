"""Encoder-decoder Transformer (Vaswani et al. 2017, section 3): a bidirectional encoder over
the source, a causal decoder over the target whose blocks also attend over the encoder's output
(:class:`~xformer_bench.models.cross_attention.CrossAttention`), and one token table shared by
source, target and the output layer (the paper's shared BPE vocabulary and tied weights,
section 3.4; ``model.tie_encoder_embedding=false`` gives the source its own table and
``head.tie=false`` the output its own matrix, Narang et al. 2021's untied rows).
``model.n_layers`` blocks each side (the paper's N = 6 + 6).

The ``attention``, ``norm``, ``activation``, ``position``, ``ffn`` and ``stack`` options apply
to both sides' self-attention and blocks (each side has its own position scheme and stack);
cross-attention is exact.  The encoder needs the attention's bidirectional form with a key
padding mask, the decoder its causal form; a stack that carries memory across segments of one
stream (Transformer-XL's) has no meaning for independent sentence pairs and is refused.
Target padding needs no mask: it sits after every real target position, which causal
attention never lets a real position see, and the loss ignores it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.models.body import (CROSS_DECODER, Assembly, build_body, initialise,
                                       refuse_streams)
from xformer_bench.models.block_sharing import side_options
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.models.cross_attention import CrossAttention
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transparent_attention import (TransparentCrossAttention,
                                                        check_transparent, encoder_states)
from xformer_bench.registry import EMBEDDING, HEAD

ENCODER = ("an encoder over padded inputs", frozenset({"bidirectional", "key_padding_mask"}))


class Encoder(nn.Module):
    """The source side's position scheme, stack and final norm."""

    def __init__(self, position: nn.Module, stack: nn.Module, final_norm: nn.Module):
        super().__init__()
        self.position, self.stack, self.final_norm = position, stack, final_norm


class EncoderDecoder(Assembly):
    def __init__(self, dims: ModelDims, attention: Mapping[str, Any], norm: Mapping[str, Any],
                 activation: Mapping[str, Any], position: Mapping[str, Any],
                 ffn: Mapping[str, Any], stack: Mapping[str, Any],
                 embedding: Mapping[str, Any] = {"name": "lookup"},  # noqa: B006 -- read-only
                 head: Mapping[str, Any] = {"name": "softmax", "tie": True},  # noqa: B006
                 *, pad_id: int, tie_encoder_embedding: bool = True,
                 transparent_attention: bool = False, **body_options: Any):
        super().__init__()
        self.dims, self.pad_id, self.transparent = dims, pad_id, transparent_attention
        self.embedding = EMBEDDING.build(embedding, vocab_size=dims.vocab_size,
                                         d_model=dims.d_model)  # the target's
        self.source_embedding = (None if tie_encoder_embedding else  # None: the target's
                                 EMBEDDING.build(embedding, vocab_size=dims.vocab_size,
                                                 d_model=dims.d_model))
        parts = (dims, attention, norm, activation, position, ffn, stack)
        self.encoder = Encoder(*build_body(*parts, assembly=ENCODER,
                                           **side_options(body_options, "encoder"))[:3])
        if transparent_attention:
            check_transparent(stack)
        self.position, self.stack, self.final_norm, _ = build_body(
            *parts, assembly=CROSS_DECODER, **side_options(body_options, "decoder"),
            cross_attention=TransparentCrossAttention if transparent_attention else CrossAttention)
        refuse_streams(self.stack, stack, "an encoder-decoder")
        self.dropout = nn.Dropout(dims.dropout)
        self.head = HEAD.build(head, embedding=self.embedding, d_model=dims.d_model)
        initialise(self, dims, self.encoder.stack, self.stack)

    def encode(self, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The encoder's output (B, S, D) over ``source`` (B, S) and its padding (B, S) bool
        (None when nothing is padded).  With transparent attention the output is every
        layer's, the embedding first: (B, N + 1, S, D)."""
        padding = source == self.pad_id  # (B, S)
        padding = padding if padding.any() else None
        ctx = ForwardContext(self.encoder.position, causal=False, key_padding_mask=padding)
        x = self.dropout(self.encoder.position.embed(
            (self.source_embedding or self.embedding)(source)))  # (B, S, D)
        ctx.layer_states = [x] if self.transparent else None
        x = self.encoder.final_norm(self.encoder.stack(x, ctx))
        if self.transparent:
            x = encoder_states(ctx.layer_states, self.encoder.final_norm)  # (B, N + 1, S, D)
        self._encoder_auxiliary_loss = ctx.auxiliary_loss()
        return x, padding

    def decode(self, target: torch.Tensor, encoded: torch.Tensor, padding: torch.Tensor | None,
               gold: torch.Tensor | None = None, cache: DecodeCache | None = None,
               **loss: Any) -> torch.Tensor:
        """Next-token log-probs (B, T, V) after each prefix of ``target`` (B, T), given the
        encoder's output of the same rows; given ``gold`` (B, T), the head's cross-entropy of
        it instead (``head.loss`` with the options ``loss``).  With ``cache``, ``target`` are
        the positions after the ``cache.length`` decoded before, which they extend
        (``TransformerLM.decode``'s contract; for a decoder ``cache_blocker`` allows)."""
        start = 0
        if cache is not None:
            cache.begin_step(target.shape[1])
            start = cache.start
        ctx = ForwardContext(self.position, causal=True, encoder_output=encoded,
                             encoder_padding_mask=padding, cache=cache)
        x = self.dropout(self.position.embed(self.embedding(target), start=start))  # (B, T, D)
        x = self.final_norm(self.stack(x, ctx))
        losses = [loss for loss in (self._encoder_auxiliary_loss, ctx.auxiliary_loss())
                  if loss is not None]
        self._auxiliary_loss = sum(losses) if losses else None
        return self.head(x) if gold is None else self.head.loss(x, gold, **loss)

    def forward(self, source: torch.Tensor, target: torch.Tensor,
                gold: torch.Tensor | None = None, **loss: Any) -> torch.Tensor:
        """Log-probs (B, T, V) of the token after each target prefix (teacher forcing), or
        the head's loss of ``gold`` (:meth:`decode`)."""
        return self.decode(target, *self.encode(source), gold, **loss)

    def example_inputs(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Random source and target tokens (for the FLOP and memory probes)."""
        generator = torch.Generator().manual_seed(0)
        shape = (batch_size, self.dims.seq_len)
        low = self.pad_id + 1 if self.pad_id == 0 else 0
        return tuple(torch.randint(low, self.dims.vocab_size, shape, generator=generator)
                     for _ in range(2))

    _encoder_auxiliary_loss: torch.Tensor | None = None
