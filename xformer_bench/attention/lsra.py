"""Long-short range attention, LSRA (Wu, Liu, Lin, Lin & Han 2020, "Lite Transformer with
Long-Short Range Attention", ICLR), section 4 and Figure 3: the input's channels are split in
two halves, one for global context through self-attention, one for local context through a
convolution, and the results concatenated,

    (X_a, X_c) = X split in halves along the channels,          each T x d/2,
    A = MultiHeadAttention(X_a)                                  (softmax, H heads of d/(2H)),
    C = LightConv(GLU(X_c W^I))                                  (W^I: d/2 x d, with bias),
    Y = [A ; C] W^O,                         W^O: d x d  (the layer named ``out``).

The attention branch is standard scaled dot-product attention on d/2 channels
(``F.scaled_dot_product_attention``, ``is_causal`` when causal) with its own q/k/v projection
(``qkv``, d/2 -> 3 d/2); it runs H = ``model.n_heads`` heads of dimension (d/2)/H, the paper's
released configurations keeping the head count per branch (e.g. ``attn:1:248:4`` beside
``dynamic:default:248:4``), so d/2 must be divisible by H.  The convolution branch is the
lightweight convolution of Wu et al. (2019) on d/2 channels with H shared kernels
(:class:`~xformer_bench.attention._ops.conv.ConvBranch`: input projection, GLU, LightConv);
``conv: dynamic`` uses their dynamic convolution instead, which is what the released Lite
Transformer configurations train (``dynamic:default``).

Simplification, stated plainly: in the paper each branch ends in its own output projection
(attention's W^O on d/2, the convolution's linear on d/2) and the concatenation goes straight
to the residual, the FFN mixing the halves.  Here the two are one d x d ``out`` after the
concatenation (a block-diagonal W^O is a special case of it), so it also mixes the halves and
has d^2 / 2 more parameters; it gives the sublayer one residual output layer, as the house's
other mixers have.

Kernel widths: ``kernel_size`` (default 31) at every layer, or ``kernel_sizes`` by layer
(``ctx.layer``, deeper layers keep the last), as for ``lightweight_conv``; causal: the kernel
covers positions t-k+1 .. t; bidirectional: centred, odd widths only (an even width declares
causal use only).  DropConnect ``weight_dropout`` on the normalised kernels (the released
configs: 0.08-0.14; default 0.0) and attention-probability ``dropout`` (their 0.08-0.14;
default 0.0).

Padding: the attention branch masks padded keys (a row with no valid key gives zeros); the
convolution branch zeroes the padded positions of its GLU output.  The attention branch
computes every pair, so LSRA is not sub-quadratic; it ignores the position scheme's rotary and
biases (it declares neither, so those positions are refused) and works at any length.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.conv import ConvBranch, KernelWidths, conv_capabilities
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION


@ATTENTION.register("lsra")
class LongShortRangeAttention(TokenMixer):
    sub_quadratic = False  # the attention half computes every pair

    def __init__(self, dims: ModelDims, kernel_size: int = 31,
                 kernel_sizes: list[int] | None = None, conv: str = "lightweight",
                 weight_dropout: float = 0.0, dropout: float = 0.0):
        super().__init__()
        d, heads = dims.d_model, dims.n_heads
        if d % 2 or (d // 2) % heads:
            raise ConfigError(f"attention=lsra gives half of model.d_model={d} to attention with "
                              f"model.n_heads={heads} heads: d_model must be even and d_model/2 "
                              f"divisible by n_heads")
        widths = KernelWidths.of("lsra", kernel_size, kernel_sizes)
        self.provides = conv_capabilities(widths)
        self.half, self.heads, self.dropout = d // 2, heads, dropout
        self.qkv = nn.Linear(self.half, 3 * self.half)  # the attention branch's q, k, v
        self.conv = ConvBranch(self.half, self.half, heads, widths, kind=conv,
                               weight_dropout=weight_dropout)
        self.out = nn.Linear(d, d)  # W^O over the concatenated branches

    def attend(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Multi-head softmax attention of the first half: (B, T, d/2) -> (B, T, d/2)."""
        b, t, _ = x.shape
        qkv = self.qkv(x).view(b, t, 3, self.heads, -1)  # (B, T, 3, H, Dh)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # (B, H, T, Dh) each
        p = self.dropout if self.training else 0.0
        padding = ctx.key_padding_mask
        if padding is None:
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=ctx.causal)
        else:
            allowed = ~padding[:, None, None, :]  # (B, 1, 1, T): the keys that count
            if ctx.causal:
                allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=p)
        return y.transpose(1, 2).reshape(b, t, self.half)  # (B, T, d/2)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        x_attention, x_conv = x.split(self.half, dim=-1)  # (B, T, d/2) each
        global_context = self.attend(x_attention, ctx)  # (B, T, d/2)
        local_context = self.conv(x_conv, causal=ctx.causal, layer=ctx.layer,
                                  key_padding_mask=ctx.key_padding_mask)  # (B, T, d/2)
        return self.out(torch.cat([global_context, local_context], dim=-1))  # (B, T, D)
