"""One Transformer layer: attention and feed-forward sublayers, each a residual branch whose
norms sit where ``model.norm_placement`` says:

* ``pre``      -- ``x + f(N(x))``            (Wang et al. 2019, Xiong et al. 2020; GPT-2);
* ``post``     -- ``N(x + f(x))``            (Vaswani et al. 2017);
* ``sandwich`` -- ``x + N(f(N(x)))``         (Ding et al. 2021, CogView's Sandwich-LN).

All three are one forward, ``N_residual(x (+) gate(N_output(f(N_input(x)))))``, with identity
in the slots a placement leaves empty.  The norm may supply the ``gate`` (ReZero, Fixup) and a
re-initialisation of the branch (Fixup); see :mod:`xformer_bench.norm`.  ``(+)`` is the
residual join, ``x + y`` unless ``model.residual`` says otherwise (GTrXL's GRU gate; see
:mod:`xformer_bench.models.residual`).  Under ``stack=recurrent`` (Transformer-XL) the attention
sublayer also attends over the previous segment's states of its layer (``ctx.memory``).  A
decoder block of an encoder-decoder has a third sublayer between the two, attention over the
encoder's output (``cross_attention``, reading ``ctx.encoder_output``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.norm import init_residual_branch, residual_gate
from xformer_bench.core.context import ForwardContext
from xformer_bench.models.residual import ResidualAdd

NORM_SLOTS = ("input", "output", "residual")
PLACEMENTS: dict[str, tuple[str, ...]] = {
    "pre": ("input",),
    "post": ("residual",),
    "sandwich": ("input", "output"),
}
SUBLAYERS = ("attention", "feedforward")
DECODER_SUBLAYERS = ("attention", "cross_attention", "feedforward")
"""A block of an encoder-decoder's decoder: self-attention, attention over the encoder's output
(Vaswani et al. 2017, section 3.1), feed-forward."""
BRANCH_DEPTH = {"attention": 4, "cross_attention": 4, "feedforward": 2}
"""Weight layers each branch multiplies together (q, k, v, out; up, down), as Fixup counts them."""


def needs_final_norm(placement: str) -> bool:
    """Whether the residual stream leaves the last block unnormalised (pre, sandwich)."""
    return "residual" not in PLACEMENTS[placement]


class Block(nn.Module):
    def __init__(
        self,
        attention: nn.Module,
        feedforward: nn.Module,
        make_norm: Callable[[], nn.Module],
        placement: str = "pre",
        dropout: float = 0.0,
        make_residual: Callable[[], nn.Module] = ResidualAdd,
        cross_attention: nn.Module | None = None,
    ):
        super().__init__()
        self.sublayers = SUBLAYERS if cross_attention is None else DECODER_SUBLAYERS
        if placement not in PLACEMENTS:
            raise ConfigError(f"model.norm_placement={placement!r}; choose one of: "
                              f"{', '.join(PLACEMENTS)}")
        self.slots = PLACEMENTS[placement]
        self.attention = attention
        if cross_attention is not None:
            self.cross_attention = cross_attention
        self.feedforward = feedforward
        self.norms = nn.ModuleDict({
            sublayer: nn.ModuleDict({
                slot: make_norm() if slot in self.slots else nn.Identity() for slot in NORM_SLOTS
            })
            for sublayer in self.sublayers
        })
        self.gates = nn.ModuleDict({sublayer: residual_gate(self.norm_of(sublayer))
                                    for sublayer in self.sublayers})
        self.joins = nn.ModuleDict({sublayer: make_residual() for sublayer in self.sublayers})
        self.dropout = nn.Dropout(dropout)

    def norm_of(self, sublayer: str) -> nn.Module:
        """The norm asked for the sublayer's gate and initialisation: its first placed one."""
        return self.norms[sublayer][self.slots[0]]

    def init_residual_branches(self, n_branches: int) -> None:
        """Let the norms re-initialise their branches (Fixup); run after the model's own init.
        ``n_branches`` counts the residual branches of the whole model."""
        for sublayer in self.sublayers:
            init_residual_branch(self.norm_of(sublayer), getattr(self, sublayer),
                                 n_branches=n_branches, depth=BRANCH_DEPTH[sublayer])

    def _sublayer(self, sublayer: str, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """``f(N_input(x))``.  With memory (``ctx.memory``, Transformer-XL) the attention attends
        over ``[memory; x]``: the memory goes through the same input norm as ``x`` (one call on
        both, so a norm of batch statistics sees what the attention sees) and reaches the
        attention as ``ctx.attention_memory`` for this call only."""
        norm_input, layer = self.norms[sublayer]["input"], getattr(self, sublayer)
        if sublayer != "attention" or ctx.memory is None:
            return layer(norm_input(x), ctx)
        m, t = ctx.memory.shape[1], x.shape[1]
        normed = norm_input(torch.cat([ctx.memory, x], dim=1))  # (B, M + T, D)
        ctx.attention_memory, x = normed.split([m, t], dim=1)  # (B, M, D), (B, T, D)
        try:
            return layer(x, ctx)
        finally:
            ctx.attention_memory = None

    def branch(self, sublayer: str, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The residual branch alone, ``gate(dropout(N_output(f(N_input(x)))))`` (B, T, D): what
        the join adds to ``x`` (reversible stacks couple branches themselves)."""
        h = self.norms[sublayer]["output"](self._sublayer(sublayer, x, ctx))  # (B, T, D)
        return self.gates[sublayer](self.dropout(h))  # (B, T, D)

    def _residual(self, sublayer: str, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        y = self.branch(sublayer, x, ctx)  # (B, T, D)
        return self.norms[sublayer]["residual"](self.joins[sublayer](x, y))  # (B, T, D)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        for sublayer in self.sublayers:
            x = self._residual(sublayer, x, ctx)
        return x
