"""The Evolved Transformer (So, Liang & Le 2019, "The Evolved Transformer", ICML, Figure 3):
the cells the architecture search found, in place of the Transformer's blocks.  Pre-LN
(every branch reads N(x), every sum adds to the stream); widths at d_model = D (the paper's
512: 2048 = 4D, 1024 = 2D, 256 = D/2); a narrower branch is zero-padded to the wider before
a sum.  Encoder cell::

    x += GLU(N(x))                          = (N(x) W_v) * sigmoid(N(x) W_g), both D -> D
    n  = N(x);  l = ReLU(Conv1x1_{4D}(n));  r = ReLU(Conv3x1_{D/2}(n))
    x += SepConv9x1_{D/2}(N_{4D}(l + pad(r)))                    (padded back to D)
    x += SelfAttention_8(N(x))               the model's attention option, model.n_heads
    x += Conv1x1_D(ReLU(Conv1x1_{d_ff}(N(x))))

Decoder cell (causal convolutions: each output reads its own and earlier positions)::

    n  = N(x);  x += SelfAttention_16(n) + AttendToEncoder_8(n)
    n  = N(x);  l = ReLU(SepConv11x1_{2D}(n));  r = SepConv7x1_{D/2}(n)
    x += SepConv7x1_D(N_{2D}(l + pad(r)))
    x += SelfAttention_8(N(x))
    x += AttendToEncoder_8(N(x))
    x += Conv1x1_D(N_{d_ff}(Swish(Conv1x1_{d_ff}(N(x)))))

A separable convolution is a depthwise k x 1 convolution (no bias) then a pointwise 1 x 1 one
(with bias), as TensorFlow's; Conv1x1 is a dense layer.  Without an encoder (a decoder-only LM)
both attend-to-encoder branches are absent, as in the authors' tensor2tensor code.  Encoder and
decoder cells are told apart by the assembly (``make_block.decoder``).

Named deviations and choices: the diagram was followed through the authors' released
implementation (tensor2tensor ``evolved_transformer.py``), whose norm between the decoder's
two dense layers and whose dropout placement are kept; the 16-head branch is
``max(16, model.n_heads)`` exact attention heads that see no in-attention position scheme
(the paper's positions are sinusoids added to the input; rotary or relative biases act only in
the 8-head attention); the dense width is ``model.d_ff`` (the paper's 2048 = the Transformer's
d_ff) while the convolution widths are the diagram's multiples of D; the model's ``activation``
is not used (the paper fixes ReLU and Swish).  Pre-LN only, plain residual adds, ``ffn=dense``,
norms without residual gates: anything else is refused in one line (declared in ``requires``).
Depth is ``model.n_layers`` cells each side (tensor2tensor's base halves the Transformer's
6 + 6 to 3 + 4 cells, each cell being about two blocks deep: set ``model.n_layers`` to match).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention.full import FullAttention
from xformer_bench.errors import ConfigError
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import STACK
from xformer_bench.stacks import BlockFactory
from xformer_bench.stacks.standard import StandardStack

WIDE_HEADS = 16
NO_POSITION = Position()  # the 16-head branch's: positions were added to the input


def widen(x: torch.Tensor, width: int) -> torch.Tensor:  # (B, T, C) -> (B, T, width), zeros after
    return F.pad(x, (0, width - x.shape[-1]))


class SeparableConv(nn.Module):
    """Depthwise k x 1 then pointwise 1 x 1: (B, T, C_in) -> (B, T, C_out); causal pads left."""

    def __init__(self, c_in: int, c_out: int, k: int, causal: bool):
        super().__init__()
        self.pad = (k - 1, 0) if causal else ((k - 1) // 2, k // 2)
        self.depthwise = nn.Conv1d(c_in, c_in, k, groups=c_in, bias=False)
        self.pointwise = nn.Linear(c_in, c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.depthwise(F.pad(x.transpose(1, 2), self.pad))  # (B, C_in, T)
        return self.pointwise(h.transpose(1, 2))  # (B, T, C_out)


class Conv3(nn.Module):
    """The encoder's standard 3 x 1 convolution, 'same' padding: (B, T, D) -> (B, T, C_out)."""

    def __init__(self, c_in: int, c_out: int):
        super().__init__()
        self.conv = nn.Conv1d(c_in, c_out, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)


class Dense(nn.Module):
    """The two 1 x 1 convolutions of the last sublayer, D -> d_ff -> D (the cell applies them)."""

    def __init__(self, d_model: int, d_ff: int):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)


class EvolvedCell(nn.Module):
    """One encoder or decoder cell; exposes what the model's checks read of a block
    (``attention``, ``feedforward``, ``norm_of``, ``sublayers``)."""

    def __init__(self, base: nn.Module, dims: ModelDims, make_norm: Callable[..., nn.Module],
                 decoder: bool):
        super().__init__()
        d, d_ff = dims.d_model, dims.d_ff
        self.decoder, self.has_encoder = decoder, hasattr(base, "cross_attention")
        self.attention, self.dropout = base.attention, nn.Dropout(dims.dropout)
        self.sublayers = (("wide_attention", "conv_branches", "attention")
                          + (("cross_attention",) if self.has_encoder else ()) + ("feedforward",)
                          if decoder else ("glu", "conv_branches", "attention", "feedforward"))
        self.norms = nn.ModuleDict({name: make_norm() for name in self.sublayers})
        self.feedforward = Dense(d, d_ff)  # the paper's, in the ffn option's place: declares
        self.feedforward.provides = getattr(base.feedforward, "provides", frozenset())  # its tags
        if decoder:
            if d % max(WIDE_HEADS, dims.n_heads):
                raise ConfigError(f"stack=evolved's decoder has a {WIDE_HEADS}-head attention: "
                                  f"model.d_model={d} must be divisible by {WIDE_HEADS}")
            wide = replace(dims, n_heads=max(WIDE_HEADS, dims.n_heads))
            self.wide_attention = MultiHeadAttention(wide, FullAttention(wide))
            self.left = SeparableConv(d, 2 * d, 11, causal=True)
            self.right = SeparableConv(d, d // 2, 7, causal=True)
            self.mid_norm = make_norm(2 * d)
            self.merge = SeparableConv(2 * d, d, 7, causal=True)
            self.dense_norm = make_norm(d_ff)
            if self.has_encoder:
                self.first_cross_attention = base.cross_attention
                self.cross_attention = type(base.cross_attention)(dims, FullAttention(dims))
        else:
            self.values, self.gates = nn.Linear(d, d), nn.Linear(d, d)  # GLU
            self.left = nn.Linear(d, 4 * d)
            self.right = Conv3(d, d // 2)
            self.mid_norm = make_norm(4 * d)
            self.merge = SeparableConv(4 * d, d // 2, 9, causal=False)

    def norm_of(self, sublayer: str) -> nn.Module:
        return self.norms[sublayer]

    def init_residual_branches(self, n_branches: int) -> None:
        """Nothing: norms that gate or re-initialise residual branches are refused."""

    @staticmethod
    def _masked(x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Padding positions zeroed before a convolution reads them (B, T, C)."""
        if ctx.key_padding_mask is None:
            return x
        return x.masked_fill(ctx.key_padding_mask[..., None], 0.0)

    def _conv_branches(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        n = self._masked(self.norms["conv_branches"](x), ctx)  # (B, T, D)
        left = self.dropout(F.relu(self.left(n)))  # (B, T, 4D | 2D)
        right = self.right(n)  # (B, T, D/2)
        right = self.dropout(right if self.decoder else F.relu(right))
        h = self._masked(self.mid_norm(left + widen(right, left.shape[-1])), ctx)
        return widen(self.merge(h), x.shape[-1])  # (B, T, D)

    def _dense(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        h = self.feedforward.up(self.norms["feedforward"](x))  # (B, T, d_ff)
        h = self.dense_norm(self.dropout(F.silu(h))) if self.decoder else self.dropout(F.relu(h))
        return self.feedforward.down(h)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        add = lambda y: x + self.dropout(y)  # noqa: E731
        if self.decoder:
            n = self.norms["wide_attention"](x)
            wide = self.wide_attention(n, replace(ctx, position=NO_POSITION))
            x = add(wide + self.first_cross_attention(n, ctx) if self.has_encoder else wide)
        else:
            n = self.norms["glu"](x)
            x = add(self.values(n) * torch.sigmoid(self.gates(n)))
        x = add(self._conv_branches(x, ctx))
        x = add(self.attention(self.norms["attention"](x), ctx))
        if self.decoder and self.has_encoder:
            x = add(self.cross_attention(self.norms["cross_attention"](x), ctx))
        return add(self._dense(x))


@STACK.register("evolved")
class EvolvedStack(StandardStack):
    """The standard loop over depth (``model.share_blocks``, ``model.checkpointing`` as there)
    over cells built from the model's blocks."""

    provides = frozenset()  # not RealFormer's ordered_blocks: the 16-head branch has no logits
    requires = {"model": frozenset({"pre_norm_blocks"}), "ffn": frozenset({"dense_feedforward"}),
                "norm": frozenset({"ungated_residual"})}

    def __init__(self, dims: ModelDims, make_block: BlockFactory, share_blocks: bool = False,
                 checkpointing: bool = False):
        def make_cell() -> EvolvedCell:
            return EvolvedCell(make_block(), dims, make_block.make_norm, make_block.decoder)

        super().__init__(dims, make_cell, share_blocks, checkpointing)
