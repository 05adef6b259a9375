"""gMLP's token mixing (Liu, Dai, So & Le 2021, "Pay Attention to MLPs", NeurIPS), section 2:
a channel up-projection, the spatial gating unit (SGU), a channel down-projection,

    Z = GELU(X U),   U: d_model x d_ffn,
    (Z_1, Z_2) = Z split in halves along the channels,
    s(Z) = Z_1 * f_{W,b}(LayerNorm(Z_2)),   f_{W,b}(Z_2) = W Z_2 + b,   W: n x n, b: n,
    Y = s(Z) V,      V: d_ffn / 2 x d_model       (the layer named ``out``),

with n = ``data.seq_len`` positions; W mixes positions, the same map for every channel, b is
one bias per position.  The paper normalises the input of f_{W,b} (its pseudo-code's
``norm(v)``) and initialises W near zero and b to ones, so that f_{W,b}(Z_2) ~ 1 and every
block starts as a per-token MLP (section 2.1).  "Near zero" is read here as W ~ U(-eps, eps),
eps = 1e-3 / n.  ``d_ffn: null`` is 6 d_model, the ratio of the paper's ImageNet models
(gMLP-Ti/S/B: d_ffn/d_model = 768/128, 1536/256, 3072/512).

In the paper a gMLP block replaces the whole Transformer layer, attention and feed-forward: its
only sublayer is the one above, with a LayerNorm before it and a residual around it.  Here it is
the token-mixing sublayer of the Block, which keeps its own norms, residuals and feed-forward
sublayer; ``ffn=none`` leaves gMLP's block alone.  The tiny attention of the paper's aMLP is not
included.

Causal: W masked to its lower triangle, so position t reads positions <= t (the paper trains
bidirectional models -- images, masked language modelling; the mask is the usual autoregressive
form of the SGU).  The mask is applied in the forward pass: one W serves both directions.  W and b
are sized by ``data.seq_len``: a longer input is an error, a shorter one uses the leading rows
and columns.  A key padding mask zeroes the padded positions of the normalised Z_2, so they add
nothing to f_{W,b} of the others.  No queries, keys or token pairs: no rotary, no additive bias.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.token_mlp import check_length, drop_padding, mix_positions
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

FFN_MULTIPLIER = 6
"""d_ffn / d_model of the paper's gMLP-Ti, -S and -B."""
SPATIAL_INIT = 1e-3
"""W ~ U(-SPATIAL_INIT / n, SPATIAL_INIT / n): the paper's near-zero init."""


@ATTENTION.register("gmlp")
class SpatialGatingMLP(TokenMixer):
    provides = frozenset({"causal", "bidirectional", "key_padding_mask"})
    sub_quadratic = False  # the n x n spatial projection is the design

    def __init__(self, dims: ModelDims, d_ffn: int | None = None):
        super().__init__()
        d_ffn = d_ffn or FFN_MULTIPLIER * dims.d_model
        if d_ffn % 2:
            raise ValueError(f"attention.d_ffn={d_ffn} must be even: the SGU splits it in halves")
        n = self.length = dims.seq_len
        self.up = nn.Linear(dims.d_model, d_ffn)  # U
        self.gate_norm = nn.LayerNorm(d_ffn // 2)
        eps = SPATIAL_INIT / n
        self.spatial_weight = nn.Parameter(torch.empty(n, n).uniform_(-eps, eps))  # (n, n): W
        self.spatial_bias = nn.Parameter(torch.ones(n))  # (n,): b
        self.out = nn.Linear(d_ffn // 2, dims.d_model)  # V

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        t = x.shape[1]
        check_length("gmlp", t, self.length)
        z1, z2 = F.gelu(self.up(x)).chunk(2, dim=-1)  # (B, T, d_ffn/2) each
        z2 = drop_padding(self.gate_norm(z2), ctx.key_padding_mask)  # (B, T, d_ffn/2)
        gate = mix_positions(self.spatial_weight[:t, :t], self.spatial_bias[:t], z2,
                             causal=ctx.causal)  # (B, T, d_ffn/2)
        return self.out(z1 * gate)  # (B, T, D)
