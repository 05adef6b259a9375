"""What a forward pass hands every sublayer besides ``x``: one object, so a new input (memory,
encoder output, padding mask, previous logits ...) is a new field here, not a new argument of
``Block.forward`` and of every layer.

Fields are added by the mechanism that needs them, with a default that means "absent"; each
layer reads only the fields it uses.  The assembly sets ``layer`` before each block.  Per-layer
memory (Transformer-XL, ``stack=recurrent``) is ``memory`` / ``attention_memory``.  Still to
come with its mechanism: the encoder output (cross-attention).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from xformer_bench.position import Position
    from xformer_bench.core.decode_cache import DecodeCache


@dataclass
class ForwardContext:
    position: Position
    """The model's position scheme: embeds, biases or rotates (see :mod:`xformer_bench.position`)."""
    causal: bool = True
    """Whether a position may attend only to itself and earlier ones (decoder) or to all (encoder)."""
    layer: int = 0
    """Index of the block being applied, counting blocks with parameters of their own: with
    ``model.share_blocks`` every application is layer 0 (per-layer tables are shared too)."""
    key_padding_mask: torch.Tensor | None = None
    """(B, S) bool, True at padding keys that no query may attend to; None: no padding."""
    previous_logits: torch.Tensor | None = None
    """(B, H, T, S): the attention logits of the previous layer, which RealFormer's next layer
    adds to its own (``model.residual_attention``); None before the first layer or when off."""
    memory: torch.Tensor | None = None
    """(B, M, D): the previous segment's input states of the block being applied (Transformer-XL's
    memory, detached), set by the stack before each block application (one memory per
    application, so a shared block applied n times has n); None: no memory."""
    attention_memory: torch.Tensor | None = None
    """(B, M, D): ``memory`` as the attention sublayer sees it -- through the block's attention
    input norm, like ``x`` -- set by the block around its attention sublayer only.  An attention
    layer prepends it to the sequence its keys and values come from (queries: ``x`` alone)."""
    cache: DecodeCache | None = None
    """Incremental decoding (:meth:`TransformerLM.decode`): the keys and values of the positions
    decoded so far, which each attention application extends with this step's and attends over
    (:mod:`xformer_bench.core.decode_cache`); None: no cache, the sequence is all of ``x``."""
    encoder_output: torch.Tensor | None = None
    """(B, S, D): the encoder's final states, which a decoder block's cross-attention attends
    over (an encoder-decoder sets it for the decoder's forward); None: no encoder.  With
    ``model.transparent_attention`` (B, L + 1, S, D): every encoder layer's output, the
    embedding first, which each decoder layer combines (:mod:`~xformer_bench.models.transparent_attention`)."""
    layer_states: list[torch.Tensor] | None = None
    """A list to which each block application appends its output (B, T, D) (set by an
    encoder whose outputs transparent attention reads); None: nothing recorded."""
    encoder_padding_mask: torch.Tensor | None = None
    """(B, S) bool, True at the encoder's padding positions, which cross-attention never reads."""
    aux_losses: list[torch.Tensor] = field(default_factory=list)
    """Scalar losses layers add in training (e.g. expert load balancing), one per application:
    a block applied several times (``model.share_blocks``) adds one each time."""

    def add_auxiliary_loss(self, loss: torch.Tensor) -> None:
        self.aux_losses.append(loss)

    def auxiliary_loss(self) -> torch.Tensor | None:
        return torch.stack(self.aux_losses).sum() if self.aux_losses else None
