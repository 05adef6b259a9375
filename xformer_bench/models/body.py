"""What every assembly shares: the position scheme, the stack of blocks built from the
registries, the final norm, and the one check that the parts go together.

An assembly (the decoder-only LM, the encoder classifier, the encoder-decoder) puts an input
adapter before the body and a head after it, and says what it needs of the parts: a decoder
needs ``causal`` attention, an encoder ``bidirectional`` (and a ``key_padding_mask`` when its
inputs are padded).  The body's modules are returned loose (:class:`Body`) and set on the
assembly as its own attributes, so every assembly's parameters keep the same names
(``stack.blocks.0...``, ``position...``, ``final_norm...``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, NamedTuple

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.models.block import Block, needs_final_norm
from xformer_bench.models.capabilities import Part, check_compatible
from xformer_bench.models.cross_attention import CrossAttention
from xformer_bench.models.hybrid import LayerMixers
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import init_weights
from xformer_bench.models.residual import residual_factory
from xformer_bench.models.residual_attention import ResidualAttention
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.registry import ATTENTION, FFN, NORM, POSITION, STACK
from xformer_bench.stacks import BlockFactory, Stack

DECODER = ("a decoder-only LM", frozenset({"causal"}))
"""How the decoder-only LM names itself in errors, and what it needs of the attention."""
CROSS_DECODER = ("an encoder-decoder's decoder", frozenset({"causal"}))
"""The decoder of an encoder-decoder: its blocks have three sublayers, which a stack coupling
two branches (``stack=reversible``) cannot undo, so it provides no ``invertible_blocks``."""


def model_parts(specs: Mapping[str, Mapping[str, Any]], modules: Mapping[str, object],
                model: Mapping[str, Any], assembly: tuple[str, frozenset[str]] = DECODER
                ) -> list[Part]:
    """The parts whose declared capabilities must agree: the assembly (named and needing of
    the attention what ``assembly`` says; it gives every depth its own block unless the blocks
    are shared, by ``model.share_blocks`` or by a stack that shares them; its blocks are
    invertible unless post-norm or a gated residual), RealFormer's needs
    (``model.residual_attention``), and the module of each group in ``modules`` (a stack may be
    given as its registered class: its declarations are class attributes), named by its option
    in ``specs``.  ``model`` holds the model keys (``share_blocks``, ``residual_attention``,
    ``norm_placement``, ``residual``)."""
    assembly_name, attention_needs = assembly
    stack = modules.get("stack")
    shared_by = ("model.share_blocks=true" if model.get("share_blocks") is True
                 else f"stack={specs['stack']['name']}"
                 if getattr(stack, "shares_blocks", False) else None)
    invertible = model.get("norm_placement", "pre") != "post" and \
        model.get("residual", "add") == "add" and assembly is not CROSS_DECODER
    if shared_by:
        name = shared_by
    elif assembly is CROSS_DECODER:
        name = assembly_name
    elif not invertible:
        name = ("model.norm_placement=post" if model.get("norm_placement") == "post"
                else f"model.residual={model.get('residual')}")
    else:
        name = assembly_name
    provides = ({"unshared_blocks"} if not shared_by else set()) | \
        ({"invertible_blocks"} if invertible else set()) | \
        ({"pre_norm_blocks"} if model.get("norm_placement", "pre") == "pre"
         and model.get("residual", "add") == "add" else set())
    needs = Part("model", assembly_name, requires={"attention": attention_needs})
    structure = Part("model", name, provides=frozenset(provides))
    logits = [Part("model", "model.residual_attention=true",
                   requires={"attention": frozenset({"dense_logits"}),
                             "stack": frozenset({"ordered_blocks"})})
              ] if model.get("residual_attention") else []

    def choice(group: str) -> str:
        named = f"{group}={specs[group]['name']}"
        realformer = isinstance(modules[group], ResidualAttention)
        return f"{named} (model.residual_attention=true)" if realformer else named

    return [*encoder_decoder_parts(model, assembly), *logits, needs, structure,
            *(Part(group, choice(group), module) for group, module in modules.items())]


def encoder_decoder_parts(model: Mapping[str, Any],
                          assembly: tuple[str, frozenset[str]]) -> list[Part]:
    """The model keys only an encoder-decoder honours (``model.share_blocks`` of one side,
    ``model.transparent_attention``), as parts needing one, and the ``task`` part saying whether
    ``assembly`` is one (its encoder and decoder are built with the keys resolved per side)."""
    share = model.get("share_blocks")
    keys = ([f"model.share_blocks={share}"] if share in ("encoder", "decoder") else []) + \
        (["model.transparent_attention=true"] if model.get("transparent_attention") else [])
    if not keys:
        return []
    task = Part("task", assembly[0], provides=frozenset({"encoder_decoder"})
                if assembly is CROSS_DECODER else frozenset())
    return [*(Part("modification", key, requires={"task": frozenset({"encoder_decoder"})})
              for key in keys), task]


def build_mixer(attention: Mapping[str, Any], dims: ModelDims,
                residual_attention: bool, causal: bool | None = None) -> nn.Module:
    """The token mixer of ``attention``, in RealFormer's form with ``residual_attention`` where
    the mixer has the logits (where not, the capability check says so in words); a mixer with
    ``specialise`` keeps only the parameters of the direction ``causal`` says it runs in."""
    mixer = build_token_mixer(attention, dims)
    if causal is not None and hasattr(mixer, "specialise"):
        mixer.specialise(causal=causal)
    if residual_attention and "dense_logits" in getattr(mixer, "provides", ()):
        return ResidualAttention.replacing(mixer, dims, attention["name"])
    return mixer


def refuse_streams(stack: Stack, spec: Mapping[str, Any], assembly: str) -> None:
    """A stack that carries memory from one segment of a stream to the next
    (Transformer-XL's) has no meaning for independent examples: one ``ConfigError`` line."""
    if getattr(stack, "streams", False):
        raise ConfigError(f"stack={spec['name']} carries memory from one segment of a stream "
                          f"to the next; {assembly} reads independent examples: choose "
                          "another stack")


class Body(NamedTuple):
    position: nn.Module
    stack: Stack
    final_norm: nn.Module
    make_norm: Callable[[], nn.Module]


def build_body(dims: ModelDims, attention: Mapping[str, Any], norm: Mapping[str, Any],
               activation: Mapping[str, Any], position: Mapping[str, Any],
               ffn: Mapping[str, Any], stack: Mapping[str, Any], *,
               assembly: tuple[str, frozenset[str]] = DECODER, norm_placement: str = "pre",
               share_blocks: bool = False, residual: str = "add",
               residual_attention: bool = False, checkpointing: bool = False,
               hybrid: Mapping[str, Any] | None = None,
               cross_attention: type[CrossAttention] = CrossAttention) -> Body:
    """Position scheme, stack and final norm of the options, checked to go together with each
    other and with ``assembly`` (one ``ConfigError`` line if not).  The blocks of
    :data:`CROSS_DECODER` attend over an encoder's output too (exact attention, by
    ``cross_attention``: transparent attention's reads every encoder layer).  ``hybrid``
    (``model.hybrid``) gives the depths it declares another token mixer
    (:mod:`xformer_bench.models.hybrid`), checked like the first."""
    if checkpointing and residual_attention:
        raise ConfigError("model.checkpointing=true recomputes each block on its own, but "
                          "model.residual_attention=true passes logits between blocks: "
                          "turn one of them off")
    make_norm = lambda dim=dims.d_model: NORM.build(norm, dim=dim)  # noqa: E731
    make_residual = residual_factory(residual, dims.d_model)
    mixers = LayerMixers(attention, hybrid, dims.n_layers, share_blocks)
    make_block = BlockFactory(lambda: Block(
        build_mixer(mixers.next_spec(), dims, residual_attention,
                    causal="causal" in assembly[1]),
        FFN.build(ffn, dims=dims, activation=activation),
        make_norm,
        placement=norm_placement,
        dropout=dims.dropout,
        make_residual=make_residual,
        cross_attention=(cross_attention(dims, ATTENTION.build({"name": "full"}, dims=dims))
                         if assembly is CROSS_DECODER else None),
    ), make_norm, decoder="causal" in assembly[1])
    scheme = POSITION.build(position, dims=dims)
    built = STACK.build(stack, dims=dims, make_block=make_block, share_blocks=share_blocks,
                        checkpointing=checkpointing)
    mixers.check_stack(built, stack["name"])
    for layer, spec, prefix in mixers.kinds():  # a block of each kind of mixer
        block = built.blocks[layer]
        parts = model_parts(
            {"attention": spec, "position": position, "norm": norm, "ffn": ffn, "stack": stack},
            {"attention": block.attention, "position": scheme,
             "norm": block.norm_of("attention"), "ffn": block.feedforward, "stack": built},
            {"share_blocks": share_blocks, "residual_attention": residual_attention,
             "norm_placement": norm_placement, "residual": residual},
            assembly)
        check_compatible([replace(part, choice=prefix + part.choice)
                          if part.group == "attention" else part for part in parts])
    # Pre-LN and sandwich leave the residual stream unnormalised: they need a final norm.
    final_norm = make_norm() if needs_final_norm(norm_placement) else nn.Identity()
    return Body(scheme, built, final_norm, make_norm)


def initialise(model: nn.Module, dims: ModelDims, *stacks: Stack) -> None:
    """The house initialisation (:func:`~xformer_bench.core.init.init_weights`), then the
    norms' re-initialisation of their residual branches (Fixup), counting the branches of all
    ``stacks`` (an encoder-decoder has two)."""
    init_weights(model, dims.d_model, dims.n_layers)
    n_branches = sum(len(stack.blocks[0].sublayers) * dims.n_layers for stack in stacks)
    for stack in stacks:
        for block in stack.blocks:
            block.init_residual_branches(n_branches=n_branches)


class Assembly(nn.Module):
    """What every assembly exposes to tasks and the run record; it sets ``stack`` and, in each
    forward, ``_auxiliary_loss`` (the forward context's sum)."""

    stack: Stack
    _auxiliary_loss: torch.Tensor | None = None

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
