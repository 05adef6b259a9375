"""Encoder-decoder attention (Vaswani et al. 2017, section 3.2.3): queries from the decoder's
stream, keys and values from the encoder's output (``ctx.encoder_output``), every decoder
position over every non-padding source position.  No position scheme acts here (the source
positions were encoded by the encoder; relative biases and rotations are self-attention's), so
the kernel is exact attention by default -- the ``attention`` option applies to
self-attention, as the issue asks, and a kernel that supports longer keys could be passed in.
Decoding from a cache (``ctx.cache``), the encoder output's keys and values are projected at
the first step and kept in this application's slot (reordered with the beam like the rest).
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.attention import AttentionKernel, TokenMixer
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims


class CrossAttention(TokenMixer):
    provides = frozenset({"bidirectional", "longer_keys", "key_padding_mask", "variable_length"})

    def __init__(self, dims: ModelDims, kernel: AttentionKernel):
        super().__init__()
        self.n_heads, self.head_dim = dims.n_heads, dims.head_dim
        self.query = nn.Linear(dims.d_model, dims.d_model)
        self.key_value = nn.Linear(dims.d_model, 2 * dims.d_model)
        self.out = nn.Linear(dims.d_model, dims.d_model)
        self.kernel = kernel

    def _heads(self, y: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, H, T, Dh)
        return y.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        if ctx.encoder_output is None:
            raise RuntimeError("cross-attention without an encoder output: the encoder-decoder "
                               "sets ctx.encoder_output before its decoder runs")
        q = self._heads(self.query(x))  # (B, H, T, Dh)
        slot = ctx.cache.slot() if ctx.cache is not None else {}
        if "encoder_keys" in slot:
            k, v = slot["encoder_keys"], slot["encoder_values"]
        else:  # (B, H, S, Dh) each
            k, v = (self._heads(y) for y in self.key_value(ctx.encoder_output).chunk(2, dim=-1))
            if ctx.cache is not None:
                slot["encoder_keys"], slot["encoder_values"] = k, v
        y = self.kernel(q, k, v, causal=False,
                        key_padding_mask=ctx.encoder_padding_mask)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).flatten(2))  # (B, T, D)
