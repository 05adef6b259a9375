"""Decoder-only Transformer language model assembled from registered components.

``forward`` scores a whole sequence; ``decode`` continues one from a key/value cache
(incremental decoding, :mod:`xformer_bench.models.kv_cache`): only ``stack=standard`` with
cacheable attention can (``kv_cache.cache_blocker`` says why not); the others are decoded by
recomputing the window (:mod:`xformer_bench.sample`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.models.block import SUBLAYERS, Block, needs_final_norm
from xformer_bench.errors import ConfigError
from xformer_bench.models.capabilities import Part, check_compatible
from xformer_bench.models.context import ForwardContext
from xformer_bench.models.dims import ModelDims
from xformer_bench.models.embedding import TokenEmbedding
from xformer_bench.models.init import init_weights
from xformer_bench.models.kv_cache import KVCache
from xformer_bench.models.output_head import OutputHead
from xformer_bench.models.residual import residual_factory
from xformer_bench.models.residual_attention import ResidualAttention
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.registry import FFN, NORM, POSITION, STACK


def lm_parts(specs: Mapping[str, Mapping[str, Any]], modules: Mapping[str, object],
             model: Mapping[str, Any]) -> list[Part]:
    """The parts of a decoder-only LM whose declared capabilities must agree: the assembly
    (it needs causal attention; it gives every depth its own block unless the blocks are
    shared, by ``model.share_blocks`` or by a stack that shares them; its blocks are
    invertible unless post-norm or a gated residual), RealFormer's needs
    (``model.residual_attention``), and the module of each group in ``modules`` (a stack may be
    given as its registered class: its declarations are class attributes), named by its option
    in ``specs``.  ``model`` holds the model keys (``share_blocks``, ``residual_attention``,
    ``norm_placement``, ``residual``)."""
    stack = modules.get("stack")
    shared_by = ("model.share_blocks=true" if model.get("share_blocks")
                 else f"stack={specs['stack']['name']}"
                 if getattr(stack, "shares_blocks", False) else None)
    invertible = model.get("norm_placement", "pre") != "post" and \
        model.get("residual", "add") == "add"
    if shared_by:
        name = shared_by
    elif not invertible:
        name = ("model.norm_placement=post" if model.get("norm_placement") == "post"
                else f"model.residual={model.get('residual')}")
    else:
        name = "a decoder-only LM"
    provides = ({"unshared_blocks"} if not shared_by else set()) | \
        ({"invertible_blocks"} if invertible else set())
    assembly = Part("model", name, provides=frozenset(provides),
                    requires={"attention": frozenset({"causal"})})
    logits = [Part("model", "model.residual_attention=true",
                   requires={"attention": frozenset({"dense_logits"}),
                             "stack": frozenset({"ordered_blocks"})})
              ] if model.get("residual_attention") else []

    def choice(group: str) -> str:
        named = f"{group}={specs[group]['name']}"
        realformer = isinstance(modules[group], ResidualAttention)
        return f"{named} (model.residual_attention=true)" if realformer else named

    return [*logits, assembly, *(Part(group, choice(group), module)
                                 for group, module in modules.items())]


def build_lm_mixer(attention: Mapping[str, Any], dims: ModelDims,
                   residual_attention: bool) -> nn.Module:
    """The token mixer of ``attention``, in RealFormer's form with ``residual_attention`` where
    the mixer has the logits (where not, the capability check says so in words)."""
    mixer = build_token_mixer(attention, dims)
    if residual_attention and "dense_logits" in getattr(mixer, "provides", ()):
        return ResidualAttention.replacing(mixer, dims, attention["name"])
    return mixer


class TransformerLM(nn.Module):
    def __init__(
        self,
        dims: ModelDims,
        attention: Mapping[str, Any],
        norm: Mapping[str, Any],
        activation: Mapping[str, Any],
        position: Mapping[str, Any],
        ffn: Mapping[str, Any] = {"name": "dense"},  # noqa: B006 -- read-only
        stack: Mapping[str, Any] = {"name": "standard"},  # noqa: B006 -- read-only
        norm_placement: str = "pre",
        tie_embeddings: bool = True,
        embedding_dim: int | None = None,
        output: str = "softmax",
        mos_components: int = 4,
        share_blocks: bool = False,
        residual: str = "add",
        residual_attention: bool = False,
        checkpointing: bool = False,
    ):
        super().__init__()
        self.dims = dims
        make_norm = lambda: NORM.build(norm, dim=dims.d_model)  # noqa: E731
        self.embedding = TokenEmbedding(dims.vocab_size, dims.d_model, embedding_dim)
        self.position = POSITION.build(position, dims=dims)
        self.dropout = nn.Dropout(dims.dropout)
        if checkpointing and residual_attention:
            raise ConfigError("model.checkpointing=true recomputes each block on its own, but "
                              "model.residual_attention=true passes logits between blocks: "
                              "turn one of them off")
        make_residual = residual_factory(residual, dims.d_model)

        make_block = lambda: Block(  # noqa: E731
            build_lm_mixer(attention, dims, residual_attention),
            FFN.build(ffn, dims=dims, activation=activation),
            make_norm,
            placement=norm_placement,
            dropout=dims.dropout,
            make_residual=make_residual,
        )
        self.stack = STACK.build(stack, dims=dims, make_block=make_block,
                                 share_blocks=share_blocks, checkpointing=checkpointing)
        self.share_blocks = share_blocks
        first = self.stack.blocks[0]
        check_compatible(lm_parts(
            {"attention": attention, "position": position, "norm": norm, "ffn": ffn,
             "stack": stack},
            {"attention": first.attention, "position": self.position,
             "norm": first.norm_of("attention"), "ffn": first.feedforward, "stack": self.stack},
            {"share_blocks": share_blocks, "residual_attention": residual_attention,
             "norm_placement": norm_placement, "residual": residual}))
        # Pre-LN and sandwich leave the residual stream unnormalised: they need a final norm.
        self.final_norm = make_norm() if needs_final_norm(norm_placement) else nn.Identity()
        self.head = OutputHead(self.embedding, dims.d_model, tie=tie_embeddings, kind=output,
                               components=mos_components)
        self._auxiliary_loss: torch.Tensor | None = None
        init_weights(self, dims.d_model, dims.n_layers)
        for block in self.stack.blocks:  # Fixup's branch re-init
            block.init_residual_branches(n_branches=len(SUBLAYERS) * dims.n_layers)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, T, V) log-probs
        ctx = ForwardContext(self.position, causal=True)
        x = self.dropout(self.position.embed(self.embedding(tokens)))  # (B, T, D)
        x = self.stack(x, ctx)
        self._auxiliary_loss = ctx.auxiliary_loss()
        return self.head(self.final_norm(x))

    def decode(self, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Log-probs (B, T, V) of ``tokens`` (B, T), the positions after the ``cache.length``
        already in ``cache``, which they extend: ``forward`` of the whole sequence, last T rows
        (up to float rounding), for a model :func:`cache_blocker` allows -- checked by the caller
        once, not here.  Positions continue at ``cache.length`` (an absolute scheme's limit
        applies: learned positions end at their table)."""
        cache.begin_step()
        ctx = ForwardContext(self.position, causal=True, cache=cache)
        x = self.dropout(self.position.embed(self.embedding(tokens), start=cache.start))
        x = self.stack(x, ctx)  # (B, T, D)
        self._auxiliary_loss = ctx.auxiliary_loss()
        return self.head(self.final_norm(x))

    def reset_memory(self, training: bool | None = None) -> None:
        """Forget past segments (``stack=recurrent``'s memory; see its ``reset_memory``)."""
        if hasattr(self.stack, "reset_memory"):
            self.stack.reset_memory(training)

    @property
    def blocks(self) -> nn.ModuleList:
        """The blocks with parameters of their own (``self.stack.blocks``)."""
        return self.stack.blocks

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def num_active_parameters(self) -> int:
        """Parameters used for one token: sparsely routed layers report what they skip."""
        skipped = sum(m.inactive_parameters() for m in self.modules()
                      if hasattr(m, "inactive_parameters"))
        return self.num_parameters() - skipped

    def report(self) -> dict[str, float]:
        """Learned quantities layers report for the run record (a ``report()`` method returning
        ``{name: value}``, e.g. adaptive span's mean span), each averaged over the layers."""
        values: dict[str, list[float]] = {}
        for module in self.modules():
            if module is not self and hasattr(module, "report"):
                for name, value in module.report().items():
                    values.setdefault(name, []).append(float(value))
        return {name: sum(v) / len(v) for name, v in values.items()}

    def auxiliary_loss(self) -> torch.Tensor | None:
        """Sum of the auxiliary losses layers added in the last forward (every application of
        a shared block counts), or None."""
        return self._auxiliary_loss
