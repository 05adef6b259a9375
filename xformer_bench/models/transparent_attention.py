"""Transparent attention (Bapna, Chen, Firat, Cao & Wu 2018, "Training Deeper Neural Machine
Translation Models with Transparent Attention", EMNLP, section 3): each decoder layer's
cross-attention reads its own learned combination of *every* encoder layer's output, the
embedding included, instead of the last layer's alone::

    s^i = sum_{j=0}^{N} softmax(W_{*,i})_j  x^j          i = 1..M decoder layers

with x^0 the embedded source, x^j the output of encoder layer j and W in R^{(N+1) x M}: one
weight vector per decoder layer (column i of W), softmax-normalised over the N + 1 encoder
states.  Here column i is the ``layer_logits`` of decoder layer i's cross-attention, so a
decoder with ``model.share_blocks`` shared has one column for all its depths.

Choices, named: each x^j passes through the encoder's final norm before the combination (a
pre-LN encoder's intermediate outputs are an unnormalised residual stream; the paper's
Transformer variant does not say), so weight 1 on j = N is exactly the standard encoder's
output; W starts at 0 (uniform weights; the paper gives no initialisation).  Only
``stack=standard`` gives one output per encoder layer; other stacks are refused in one line,
and a model without an encoder (decoder-only LM, classifier) refuses the option in one line
(declared by :func:`~xformer_bench.models.body.encoder_decoder_parts`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.models.cross_attention import CrossAttention
from xformer_bench.core.dims import ModelDims

OPTION = "model.transparent_attention=true"


class TransparentCrossAttention(CrossAttention):
    """Cross-attention over ``s = sum_j softmax(w)_j x^j``, ``ctx.encoder_output`` holding
    the N + 1 encoder states (B, N + 1, S, D)."""

    def __init__(self, dims: ModelDims, kernel: AttentionKernel):
        super().__init__(dims, kernel)
        self.layer_logits = nn.Parameter(torch.zeros(dims.n_layers + 1))  # (N + 1,): W_{*,i}

    def layer_weights(self) -> torch.Tensor:  # (N + 1,), on the simplex
        return torch.softmax(self.layer_logits.float(), dim=0)

    def combine(self, states: torch.Tensor) -> torch.Tensor:  # (B, N + 1, S, D) -> (B, S, D)
        weights = self.layer_weights().to(states.dtype)
        return torch.einsum("j,bjsd->bsd", weights, states)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        states = ctx.encoder_output
        if states is None or states.dim() != 4:
            raise RuntimeError("transparent attention reads every encoder layer's output: "
                               "ctx.encoder_output must be (B, N + 1, S, D)")
        ctx.encoder_output = self.combine(states)  # (B, S, D) for this sublayer only
        try:
            return super().forward(x, ctx)
        finally:
            ctx.encoder_output = states


def encoder_states(states: list[torch.Tensor], final_norm: nn.Module) -> torch.Tensor:
    """The embedding and each encoder layer's output, each through the encoder's final norm:
    N + 1 tensors (B, S, D) -> (B, N + 1, S, D)."""
    return torch.stack([final_norm(x) for x in states], dim=1)


def check_transparent(stack: Mapping[str, Any]) -> None:
    """One ``ConfigError`` line unless the encoder's stack gives one output per layer."""
    if stack["name"] != "standard":
        raise ConfigError(f"{OPTION} combines one output per encoder layer, which "
                          f"stack={stack['name']} does not give: choose stack=standard")

