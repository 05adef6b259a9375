"""Decoder-only Transformer language model assembled from registered components."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.models.attention_layer import MultiHeadAttention
from xformer_bench.models.block import SUBLAYERS, Block, needs_final_norm
from xformer_bench.models.context import ForwardContext
from xformer_bench.models.dims import ModelDims
from xformer_bench.models.embedding import TokenEmbedding
from xformer_bench.models.init import init_weights
from xformer_bench.models.output_head import OutputHead
from xformer_bench.registry import ATTENTION, FFN, NORM, POSITION


def refuse_shared_running_statistics(block: nn.Module) -> None:
    """A shared block must not keep running statistics (persistent buffers that training
    updates, e.g. PowerNorm's): applied at every depth, it would average all depths' statistics
    into one, which no layer of an unshared model sees."""
    saved = block.state_dict(keep_vars=True)
    for name, _ in block.named_buffers():
        if name in saved:  # persistent: state, not a constant
            owner = type(block.get_submodule(name.rpartition(".")[0])).__name__
            raise ConfigError(
                f"model.share_blocks=true would mix every depth into one running statistic "
                f"({owner}.{name.rpartition('.')[2]}); choose another norm or "
                "model.share_blocks=false")


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
        if shared is not None:
            refuse_shared_running_statistics(shared)
        self.blocks = nn.ModuleList(shared or make_block(i) for i in range(dims.n_layers))
        # Pre-LN and sandwich leave the residual stream unnormalised: they need a final norm.
        self.final_norm = make_norm() if needs_final_norm(norm_placement) else nn.Identity()
        self.head = OutputHead(self.embedding, dims.d_model, tie=tie_embeddings, kind=output,
                               components=mos_components)
        self._auxiliary_loss: torch.Tensor | None = None
        init_weights(self, dims.d_model, dims.n_layers)
        for block in self.blocks[: 1 if share_blocks else None]:  # Fixup's branch re-init
            block.init_residual_branches(n_branches=len(SUBLAYERS) * dims.n_layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V) log-probs
        ctx = ForwardContext(self.position)
        x = self.dropout(self.position.embed(self.embedding(tokens)))  # (B, T, D)
        for block in self.blocks:
            x = block(x, ctx)
        self._auxiliary_loss = ctx.auxiliary_loss()
        return self.head(self.final_norm(x))

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def num_active_parameters(self) -> int:
        """Parameters used for one token: sparsely routed layers report what they skip."""
        skipped = sum(m.inactive_parameters() for m in self.modules()
                      if hasattr(m, "inactive_parameters"))
        return self.num_parameters() - skipped

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Sum of the auxiliary losses layers added in the last forward (every application of
        a shared block counts), or None."""
        return self._auxiliary_loss
