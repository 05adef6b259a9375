"""Local (sliding-window) attention: each query attends only the ``window`` keys nearest to
it -- the previous ``window``, itself included, when causal; ``window // 2`` on each side
otherwise -- as in the local layers of GPT-Neo (Black et al. 2021, window 256) and the
sliding window of Longformer (Beltagy et al. 2020, "Longformer: The Long-Document
Transformer", section 3.1):

    out_i = sum_{j in W(i)} softmax_j(q_i . k_j / sqrt(Dh) + b_ij) v_j,   W(i) = [i - w + 1, i].

Computed blockwise (:func:`~xformer_bench.attention._ops.window.windowed_attention`): blocks of
queries against the keys they need (block + window - 1 of them), O(T * w) time and memory.
A window of T or more is full attention.
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


@ATTENTION.register("local")
class LocalAttention(AttentionKernel):
    sub_quadratic = True

    def __init__(self, dims: ModelDims, window: int = 256):
        super().__init__()
        window_reach(window, causal=True)  # validates
        self.window = window

    def flex_pattern(self, t, s, causal, layer, heads) -> WindowPattern:
        return WindowPattern(*window_reach(self.window, causal))

    def band(self, s: int, layer: int) -> Band | None:
        """The fused CPU path's layout for S positions (:mod:`._ops.fused_band`)."""
        return Band(min(max(self.window // 2, 1), s), self.window - 1)  # rows of w / 2: fastest

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
                                  after=after, causal=causal, bias=bias,
                                  key_padding_mask=key_padding_mask)
