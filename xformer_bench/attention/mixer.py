"""MLP-Mixer's token-mixing MLP (Tolstikhin, Houlsby, Kolesnikov, Beyer, Zhai, Unterthiner,
Yung, Steiner, Keysers, Uszkoreit, Lucic & Dosovitskiy 2021, "MLP-Mixer: An all-MLP
Architecture for Vision", NeurIPS), section 2, eq. 1: for every channel i, an MLP across the
S positions of the (layer-normalised) input X,

    U_{*,i} = W_2 sigma(W_1 X_{*,i}),      W_1: D_S x S,  W_2: S x D_S,  sigma = GELU,

with biases on both layers (the authors' ``MlpBlock``: two dense layers, GELU between).  Here S
is ``data.seq_len`` and D_S is ``token_hidden``.  The LayerNorm before it and the residual
around it are the Block's; the channel-mixing MLP is the Block's feed-forward sublayer, so a
Block with ``attention=mixer`` is a Mixer layer.  Weights are initialised as the authors' flax
``nn.Dense``: LeCun normal (truncated, variance 1 / fan_in), biases zero.

Causal variant (not in the paper, an image model): a two-layer MLP over positions can only be
causal if its hidden units are indexed by positions too, so it needs D_S = S.  Then W_1 and W_2
are masked to their lower triangles: hidden unit t reads positions s <= t, output t reads hidden
units h <= t, hence positions <= t.  ``token_hidden: null`` (the default) sets D_S = S, which
serves both directions; any other width is bidirectional only, the plain MLP (the paper's D_S
over S: 256/49 for Mixer-S/32, 384/196 for Mixer-B/16, 512/196 for L/16, 640/256 for H/14).
The masks are applied in the forward pass, so one set of weights serves causal and
bidirectional use; under the mask the first positions see fewer inputs than the init's fan-in.

The weights are sized by ``data.seq_len``: a longer input is an error, a shorter one uses the
leading positions (as if zero-padded; still causal).  A key padding mask zeroes the padded
positions' inputs.  No queries, keys or token pairs: no rotary, no additive bias.  There is no
output projection (``out``), so Fixup, which zeroes one, refuses it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.token_mlp import check_length, drop_padding, mix_positions
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

TRUNCATED_STD = 0.87962566103423978
"""Standard deviation of N(0, 1) truncated to [-2, 2]: flax's variance-scaling divides by it."""


def lecun_normal(rows: int, fan_in: int) -> torch.Tensor:
    """flax's default dense kernel: truncated normal of variance 1 / fan_in, (rows, fan_in)."""
    std = 1 / math.sqrt(fan_in) / TRUNCATED_STD
    return nn.init.trunc_normal_(torch.empty(rows, fan_in), std=std, a=-2 * std, b=2 * std)


@ATTENTION.register("mixer")
class TokenMixingMLP(TokenMixer):
    sub_quadratic = False  # S x D_S weights over positions are the design

    def __init__(self, dims: ModelDims, token_hidden: int | None = None):
        super().__init__()
        self.length = dims.seq_len
        hidden = token_hidden or dims.seq_len
        self.hidden_weight = nn.Parameter(lecun_normal(hidden, self.length))  # (D_S, S): W_1
        self.hidden_bias = nn.Parameter(torch.zeros(hidden))  # (D_S,)
        self.output_weight = nn.Parameter(lecun_normal(self.length, hidden))  # (S, D_S): W_2
        self.output_bias = nn.Parameter(torch.zeros(self.length))  # (S,)
        self.can_be_causal = hidden == self.length  # hidden unit t <-> position t
        directions = {"causal", "bidirectional"} if self.can_be_causal else {"bidirectional"}
        self.provides = frozenset({*directions, "key_padding_mask"})

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        t = x.shape[1]
        check_length("mixer", t, self.length)
        if ctx.causal and not self.can_be_causal:
            raise ValueError(f"attention=mixer is causal only with token_hidden = data.seq_len "
                             f"= {self.length}, got {self.hidden_bias.numel()}")
        x = drop_padding(x, ctx.key_padding_mask)  # (B, T, D)
        hidden = mix_positions(self.hidden_weight[:, :t], self.hidden_bias, x,
                               causal=ctx.causal)  # (B, D_S, D)
        return mix_positions(self.output_weight[:t], self.output_bias[:t], F.gelu(hidden),
                             causal=ctx.causal)  # (B, T, D)
