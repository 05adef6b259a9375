"""Encoder with a classification head: the assembly of LRA's tasks (ListOps, image), ViT and
ImageNet classification.

Inputs go through an adapter (:mod:`xformer_bench.models.input_adapters`: token embedding or
ViT patches), optionally a learned [CLS] vector in front, the positions, the body's stack of
blocks with *bidirectional* attention (every position sees every non-padding one: padding
keys are masked through ``ctx.key_padding_mask``), the final norm, then a pooled vector -- the
[CLS] position's final state (``pool: cls``, BERT / ViT) or the mean over non-padding
positions (``pool: mean``, as LRA's encoders do) -- and one linear layer to class logits,
initialised to zero as ViT's head (Dosovitskiy et al. 2021, appendix B.1), so training starts
from the uniform prediction.  The attention, norm, activation, position, ffn and stack options
are the decoder LM's; each must support what an encoder needs (bidirectional attention, and a
key padding mask where the data pads), checked when built.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.models.body import Assembly, build_body, initialise, refuse_streams
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import mark_initialised
from xformer_bench.models.input_adapters import ClassToken, PatchEmbedding, patch_grid
from xformer_bench.registry import EMBEDDING

POOLS = ("cls", "mean")
INPUT_KINDS = ("tokens", "image")


def encoder_length(input_kind: str, seq_len: int, image_shape: tuple[int, int, int] | None,
                   patch_size: int, pool: str) -> int:
    """Positions the body sees: the tokens or patches, plus the [CLS] vector if pooled from it."""
    if input_kind not in INPUT_KINDS:
        raise ConfigError(f"a classifier reads inputs of kind {INPUT_KINDS}, not {input_kind!r}")
    if pool not in POOLS:
        raise ConfigError(f"model.pool={pool!r}; choose one of {', '.join(POOLS)}")
    if input_kind == "tokens":
        return seq_len + (pool == "cls")
    rows, columns = patch_grid(image_shape, patch_size)
    return rows * columns + (pool == "cls")


class TransformerClassifier(Assembly):
    def __init__(self, dims: ModelDims, attention: Mapping[str, Any], norm: Mapping[str, Any],
                 activation: Mapping[str, Any], position: Mapping[str, Any],
                 ffn: Mapping[str, Any], stack: Mapping[str, Any], *, num_classes: int,
                 input_kind: str = "tokens", image_shape: tuple[int, int, int] | None = None,
                 patch_size: int = 4, pad_id: int | None = None, pool: str = "cls",
                 embedding: Mapping[str, Any] = {"name": "lookup"},  # noqa: B006 -- read-only
                 **body_options: Any):
        """``dims.seq_len`` is the body's length (:func:`encoder_length`); ``dims.vocab_size``
        the tokens' vocabulary (unused for images); ``body_options`` the model keys the body
        takes (``norm_placement``, ``share_blocks``, ``residual``, ...)."""
        super().__init__()
        self.dims, self.pool, self.pad_id = dims, pool, pad_id
        self.input_kind, self.image_shape = input_kind, image_shape
        padded = input_kind == "tokens" and pad_id is not None
        self.adapter = (EMBEDDING.build(embedding, vocab_size=dims.vocab_size,
                                        d_model=dims.d_model)
                        if input_kind == "tokens"
                        else PatchEmbedding(image_shape, patch_size, dims.d_model))
        self.class_token = ClassToken(dims.d_model) if pool == "cls" else None
        needs = {"bidirectional"} | ({"key_padding_mask"} if padded else set())
        name = "an encoder" + (" over padded inputs" if padded else "")
        self.position, self.stack, self.final_norm, _ = build_body(
            dims, attention, norm, activation, position, ffn, stack,
            assembly=(name, frozenset(needs)), **body_options)
        refuse_streams(self.stack, stack, "a classifier")
        self.dropout = nn.Dropout(dims.dropout)
        self.head = nn.Linear(dims.d_model, num_classes)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        mark_initialised(self.head.weight, self.head.bias)
        initialise(self, dims, self.stack)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:  # -> (B, num_classes) logits
        padding = inputs == self.pad_id if self.pad_id is not None and not \
            inputs.is_floating_point() else None  # (B, T) True at padding
        x = self.adapter(inputs)  # (B, N, D)
        if self.class_token is not None:
            x = self.class_token(x)  # (B, 1 + N, D)
            if padding is not None:
                padding = F.pad(padding, (1, 0), value=False)
        if padding is not None and not padding.any():
            padding = None  # no padding in this batch: the kernels' fast path
        ctx = ForwardContext(self.position, causal=False, key_padding_mask=padding)
        x = self.final_norm(self.stack(self.dropout(self.position.embed(x)), ctx))  # (B, N', D)
        self._auxiliary_loss = ctx.auxiliary_loss()
        return self.head(self._pool(x, padding))

    def example_inputs(self, batch_size: int) -> torch.Tensor:
        """A batch of random inputs of the model's kind (for the FLOP and memory probes)."""
        generator = torch.Generator().manual_seed(0)
        if self.input_kind == "image":
            return torch.randn(batch_size, *self.image_shape, generator=generator)
        n_tokens = self.dims.seq_len - (self.class_token is not None)
        low = 1 if self.pad_id == 0 else 0  # no padding in the probe
        return torch.randint(low, self.dims.vocab_size, (batch_size, n_tokens),
                             generator=generator)

    def _pool(self, x: torch.Tensor, padding: torch.Tensor | None) -> torch.Tensor:  # (B, D)
        if self.pool == "cls":
            return x[:, 0]
        if padding is None or padding.shape[1] != x.shape[1]:  # a funnel shortened the sequence
            return x.mean(dim=1)
        keep = (~padding).unsqueeze(-1).to(x.dtype)  # (B, T, 1)
        return (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
