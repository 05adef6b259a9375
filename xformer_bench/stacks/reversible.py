"""The reversible stack (``stack=reversible``): RevNet coupling (Gomez, Ren, Urtasun & Grosse
2017, "The Reversible Residual Network") as the Reformer uses it (Kitaev, Kaiser & Levskaya
2020, "Reformer: The Efficient Transformer", ICLR, section 3).

The input is duplicated into two streams, ``(X1, X2) = (x, x)``, and each layer computes

    Y1 = X1 + Attention(X2)
    Y2 = X2 + FeedForward(Y1)

where Attention and FeedForward are the block's residual *branches* -- everything of
:meth:`Block._residual` but the residual add: ``gate(dropout(N_output(f(N_input(x)))))``.
The backward pass inverts each layer from its outputs, ``X2 = Y2 - FeedForward(Y1)``,
``X1 = Y1 - Attention(X2)``, recomputing each branch to backpropagate through it (see
:mod:`xformer_bench.stacks._reversible_function`): what is stored is the last layer's
``(Y1, Y2)`` plus, per branch application, the RNG, autocast and module state needed to
replay it -- no per-layer activations, so activation memory stays flat in depth (at roughly
one branch's graph) while compute grows by about one forward pass, as with checkpointing.

``ffn_chunks: c`` (Reformer section 3, "Chunking") applies the feed-forward branch to c pieces
of the sequence one after another, in the forward pass and in the backward recompute: it is
position-wise, so the result is the same (for a routed ``ffn`` the expert capacity is per
piece) and the peak memory of its d_ff-wide hidden layer is divided by c.  1 = no chunking.

Stated simplifications and choices:

* the two streams are combined into the output as their mean ``(Y1 + Y2) / 2`` (as several
  reimplementations do); the Reformer concatenates them (2 d_model wide), but this model's
  final norm and output head take d_model;
* the attention branch is applied to the whole sequence (the Reformer also chunks attention
  queries; the attention kernels here manage their own memory);
* auxiliary losses (``ffn=moe``/``switch`` load balancing, adaptive span's penalty) are
  supported: the branch's losses leave the autograd Function as extra outputs and their
  gradients flow in the recompute (one loss per branch application; under ``ffn_chunks`` the
  mean over the pieces);
* with ``model.share_blocks`` one block is applied ``n_layers`` times (``ctx.layer = 0``);
* the autograd Function is used whenever gradients are needed (in eval mode too), so the run
  record's FLOPs, counted on a forward + backward, include the recompute; without gradients
  (validation) the same coupling runs as a plain loop.

Declared needs (one ``ConfigError`` line from the capability check): blocks the coupling can
invert (``invertible_blocks``: not ``model.norm_placement=post`` nor ``model.residual=gru_gate``,
whose residual is not ``x + branch``); and, not providing ``ordered_blocks``, it is refused by
``model.residual_attention=true`` (RealFormer passes logits from block to block through the
context, which a layer-by-layer recompute cannot replay).  ``model.checkpointing`` adds
nothing: every layer is recomputed already.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import STACK
from xformer_bench.stacks import Stack
from xformer_bench.stacks._reversible_function import Branch, ReversibleCoupling, couple


def branch(block: nn.Module, sublayer: str, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
    """The residual branch of ``block``'s ``sublayer`` alone (:meth:`Block.branch`)."""
    return block.branch(sublayer, x, ctx)


@STACK.register("reversible")
class ReversibleStack(Stack):
    requires = {"model": frozenset({"invertible_blocks"})}

    def __init__(self, dims: ModelDims, make_block: Callable[[], nn.Module],
                 share_blocks: bool = False, checkpointing: bool = False, ffn_chunks: int = 1):
        super().__init__()
        # model.checkpointing adds nothing: every layer is recomputed in the backward pass.
        if type(ffn_chunks) is not int or ffn_chunks < 1:
            raise ConfigError(f"stack.ffn_chunks={ffn_chunks!r} must be a positive integer "
                              "(1: no chunking)")
        self.n_layers, self.share_blocks, self.ffn_chunks = dims.n_layers, share_blocks, ffn_chunks
        n_blocks = 1 if share_blocks else dims.n_layers
        self.blocks = nn.ModuleList(make_block() for _ in range(n_blocks))

    def _trainable(self, ctx: ForwardContext) -> tuple[list[nn.Parameter], list[tuple[int, ...]]]:
        """The trainable parameters the branches may use (the blocks', the position scheme's),
        and for each block the indices of its own plus the position scheme's."""
        params: list[nn.Parameter] = []
        index: dict[int, int] = {}

        def indices(module: nn.Module) -> list[int]:
            for p in module.parameters():
                if p.requires_grad and id(p) not in index:
                    index[id(p)] = len(params)
                    params.append(p)
            return [index[id(p)] for p in module.parameters() if p.requires_grad]

        shared = indices(ctx.position) if isinstance(ctx.position, nn.Module) else []
        per_block = [tuple(sorted(set(indices(block)) | set(shared))) for block in self.blocks]
        return params, per_block

    def _layers(self, per_block: list[tuple[int, ...]]) -> list[tuple[Branch, Branch]]:
        def bound(layer: int, sublayer: str
                  ) -> Callable[[torch.Tensor, ForwardContext], torch.Tensor]:
            def fn(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
                ctx.layer = layer
                return branch(self.blocks[layer], sublayer, x, ctx)
            return fn

        layers = []
        for i in range(self.n_layers):
            layer = 0 if self.share_blocks else i
            block, params = self.blocks[layer], per_block[layer]
            layers.append((Branch(bound(layer, "attention"), block, params),
                           Branch(bound(layer, "feedforward"), block, params, self.ffn_chunks)))
        return layers

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        params, per_block = self._trainable(ctx)
        layers = self._layers(per_block)
        if torch.is_grad_enabled() and (x.requires_grad or params):
            y1, y2, *losses = ReversibleCoupling.apply(layers, ctx, x, x, *params)
        else:  # nothing to differentiate: the same coupling, plain
            y1, y2, losses = couple(layers, x, x, ctx)
        for loss in losses:
            ctx.add_auxiliary_loss(loss)
        return (y1 + y2) / 2  # (B, T, D): the streams' mean stands in for Reformer's concat
