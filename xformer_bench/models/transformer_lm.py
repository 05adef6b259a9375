"""Decoder-only Transformer language model assembled from registered components."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.models.attention_layer import MultiHeadAttention
from xformer_bench.models.block import SUBLAYERS, Block, needs_final_norm
from xformer_bench.models.dims import ModelDims
from xformer_bench.models.embedding import TokenEmbedding
from xformer_bench.models.output_head import OutputHead
from xformer_bench.registry import ATTENTION, FFN, NORM, POSITION


class TransformerLM(nn.Module):
    def __init__(
        self,
        dims: ModelDims,
        attention: Mapping[str, Any],
        norm: Mapping[str, Any],
        activation: Mapping[str, Any],
        position: Mapping[str, Any],
        ffn: Mapping[str, Any] = {"name": "dense"},  # noqa: B006 -- read-only
        norm_placement: str = "pre",
        tie_embeddings: bool = True,
        embedding_dim: int | None = None,
        output: str = "softmax",
        mos_components: int = 4,
        share_blocks: bool = False,
    ):
        super().__init__()
        self.dims = dims
        make_norm = lambda: NORM.build(norm, dim=dims.d_model)  # noqa: E731
        self.embedding = TokenEmbedding(dims.vocab_size, dims.d_model, embedding_dim)
        self.position = POSITION.build(position, dims=dims)
        self.dropout = nn.Dropout(dims.dropout)
        make_block = lambda i: Block(  # noqa: E731
            MultiHeadAttention(dims, ATTENTION.build(attention, dims=dims), layer=i),
            FFN.build(ffn, dims=dims, activation=activation),
            make_norm,
            placement=norm_placement,
            dropout=dims.dropout,
        )
        # Block sharing (Dehghani et al. 2019; Lan et al. 2020): one block applied L times.
        shared = make_block(0) if share_blocks else None
        self.blocks = nn.ModuleList(shared or make_block(i) for i in range(dims.n_layers))
        # Pre-LN and sandwich leave the residual stream unnormalised: they need a final norm.
        self.final_norm = make_norm() if needs_final_norm(norm_placement) else nn.Identity()
        self.head = OutputHead(self.embedding, dims.d_model, tie=tie_embeddings, kind=output,
                               components=mos_components)
        self._init_weights()
        for block in self.blocks[: 1 if share_blocks else None]:  # Fixup's branch re-init
            block.init_residual_branches(n_branches=len(SUBLAYERS) * dims.n_layers)

    def _init_weights(self) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 L); the
        token table N(0, 1/D) so that, times sqrt(D), token vectors have unit scale like the
        sinusoidal positions (Vaswani et al. 2017)."""
        residual_std = 0.02 / math.sqrt(2 * self.dims.n_layers)
        for name, p in self.named_parameters():
            if name.startswith("position."):
                continue
            if name == "embedding.table.weight":
                nn.init.normal_(p, std=p.shape[1] ** -0.5)
            elif p.dim() >= 2:
                std = residual_std if name.endswith(("out.weight", "down.weight")) else 0.02
                nn.init.normal_(p, std=std)
            elif name.endswith(".bias") and "norm" not in name:
                nn.init.zeros_(p)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V) log-probs
        x = self.dropout(self.position.embed(self.embedding(tokens)))  # (B, T, D)
        for block in self.blocks:
            x = block(x, self.position)
        return self.head(self.final_norm(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def num_active_parameters(self) -> int:
        """Parameters used for one token: sparsely routed layers report what they skip."""
        skipped = sum(m.inactive_parameters() for m in self.modules()
                      if hasattr(m, "inactive_parameters"))
        return self.num_parameters() - skipped

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Sum of the ``aux_loss`` that layers (e.g. expert routers) set in the last forward."""
        losses = [m.aux_loss for m in self.modules() if getattr(m, "aux_loss", None) is not None]
        return torch.stack(losses).sum() if losses else None
