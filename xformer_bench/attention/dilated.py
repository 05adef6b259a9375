"""Dilated sliding-window attention (Beltagy et al. 2020, "Longformer: The Long-Document
Transformer", section 3.1, "Dilated Sliding Window"): the window has gaps of size d - 1, so
each query attends ``window`` keys, every d-th position, over a receptive field of
(window - 1) * d + 1 positions:

    W(i) = {i, i - d, ..., i - (w - 1) d}  (causal),   {i + m d : |m| <= w / 2}  (bidirectional).

Computed as local attention within each of d lanes (positions r, r + d, r + 2d, ...), where
the dilated band is contiguous (:func:`~xformer_bench.attention._ops.window.windowed_attention`):
O(T * w), whatever d.  Longformer dilates only some heads of the upper layers; this kernel
dilates every head of every layer it is used in (mix it with ``local`` per layer for the
paper's arrangement).  The default, 256 keys at dilation 2 (receptive field 511), keeps the
cost of ``local`` while doubling its reach.
Causal training and evaluation on CPU (no bias, no key padding) run as fused kernel calls
over rows of the sequence (:mod:`._ops.fused_band`): full attention's step memory, nothing
recomputed; the windowed path (bias, padding, bidirectional, decoding) recomputes its gathers
in the backward pass (:mod:`._ops.recompute`).
"""

from __future__ import annotations

import torch

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.fused_band import Band, fused_band_on_cpu
from xformer_bench.attention._ops.flex import WindowPattern, flex_dispatch
from xformer_bench.attention._ops.recompute import recomputed
from xformer_bench.attention._ops.window import band_block, window_reach, windowed_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("dilated")
class DilatedAttention(AttentionKernel):
    sub_quadratic = True

    def __init__(self, dims: ModelDims, window: int = 256, dilation: int = 2):
        super().__init__()
        window_reach(window, causal=True)  # validates
        if dilation < 1:
            raise ValueError(f"attention.dilation={dilation} must be >= 1")
        self.window, self.dilation = window, dilation

    def flex_pattern(self, t, s, causal, layer, heads) -> WindowPattern:
        return WindowPattern(*window_reach(self.window, causal), dilation=self.dilation)

    def band(self, s: int, layer: int) -> Band | None:
        """The fused CPU path's layout for S positions (:mod:`._ops.fused_band`)."""
        return Band(min(max(self.window // 2, 1), -(-s // self.dilation)), self.window - 1,
                    dilation=self.dilation)

    @flex_dispatch
    @fused_band_on_cpu
    @recomputed
    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, S, Dh)
        v: torch.Tensor,  # (B, H, S, Dh)
        *,
        causal: bool,
        bias: PairBias | None = None,
        key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        before, after = window_reach(self.window, causal)
        return windowed_attention(q, k, v, block=band_block(before + after), before=before,
                                  after=after, causal=causal, dilation=self.dilation,
                                  bias=bias, key_padding_mask=key_padding_mask)
