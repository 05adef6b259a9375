"""Longformer attention (Beltagy et al. 2020, "Longformer: The Long-Document Transformer",
section 3.1): a sliding window of ``window`` keys, optionally dilated, plus ``n_global``
global tokens with symmetric global attention -- a global token attends every key and every
query attends it.  Here the global tokens are the **first ``n_global`` positions** (the [CLS]
token of classification at the default 1; the paper picks them per task, e.g. the question
in QA).  In causal mode a global token attends only the keys before it and is attended only
by the queries after it.

    out_i = sum_{j in W(i) u G} softmax_j(q_i k_j / sqrt(Dh) + b_ij) v_j   (i not global),
    out_i = full attention of q_i                                          (i in G).

The window part is blockwise (:func:`~xformer_bench.attention._ops.window.windowed_attention`),
the global keys' scores join the window's in one softmax, and the g global query rows are a
separate dense pass, O(g * T): O(T * (w + g)) in all, never T x T.  The paper gives global
attention its own projections (Q_g, K_g, V_g); this kernel shares the layer's projections, as
do the kernels it sits beside, and dilates every head when ``dilation`` > 1 (the paper:
some heads of the upper layers).
Causal and undilated on CPU (no bias, no key padding), it runs as fused kernel calls
(:mod:`._ops.fused_band`): the window's rows and one call for the global keys past the
window's reach, nothing gathered or stored but the output and its normaliser.
"""

from __future__ import annotations

import torch

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.fused_band import Band, fused_band_on_cpu
from xformer_bench.attention._ops.flex import WindowPattern, flex_dispatch
from xformer_bench.attention._ops.window import band_block, window_reach, windowed_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("longformer")
class LongformerAttention(AttentionKernel):
    sub_quadratic = True

    def __init__(self, dims: ModelDims, window: int = 512, n_global: int = 1, dilation: int = 1):
        super().__init__()
        window_reach(window, causal=True)  # validates
        if n_global < 0 or dilation < 1:
            raise ValueError(f"attention.n_global={n_global} must be >= 0 and "
                             f"attention.dilation={dilation} >= 1")
        self.window, self.n_global, self.dilation = window, n_global, dilation

    def flex_pattern(self, t, s, causal, layer, heads) -> WindowPattern:
        return WindowPattern(*window_reach(self.window, causal), dilation=self.dilation,
                             n_global=self.n_global)

    def band(self, s: int, layer: int) -> Band | None:
        """The fused CPU path's layout for S positions (:mod:`._ops.fused_band`)."""
        if self.dilation > 1:  # a dilated window with global keys: the windowed path only
            return None
        return Band(min(max(self.window // 2, 1), s), self.window - 1, n_global=self.n_global)

    @flex_dispatch
    @fused_band_on_cpu
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
                                  n_global=self.n_global, bias=bias,
                                  key_padding_mask=key_padding_mask)
