"""Block-local attention, the 1-D local attention of the Image Transformer (Parmar et al.
2018, "Image Transformer", section 3.2): the sequence is cut into query blocks of ``block``
positions, and every query of a block attends the same memory -- its block plus the
``memory`` positions before it, masked causally within the block in causal mode:

    out_i = sum_{j in M(n)} softmax_j(q_i k_j / sqrt(Dh) + b_ij) v_j,
    M(n) = [n l_q - memory, (n + 1) l_q - 1]  for the block n of query i.

Defaults: query blocks of 256 with a memory of the previous 256 positions (a memory block of
512 in all), the settings of the paper's 1-D local models (tensor2tensor ``imagetransformer``:
``block_length=256``, the masked memory being the previous block).  Bidirectionally (the
paper's encoder uses full attention; this follows tensor2tensor's unmasked
``local_attention_1d``), a block attends ``memory`` positions on each side of it.  Blocks
lie at absolute positions (block n holds positions n l_q .. (n + 1) l_q - 1, the queries being
the last T of the S keys), so a decode step over cached keys sees what the full pass sees.
Cost O(T * (block + memory)), computed by
:func:`~xformer_bench.attention._ops.window.windowed_attention`.
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
from xformer_bench.attention._ops.window import windowed_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("block_local")
class BlockLocalAttention(AttentionKernel):
    sub_quadratic = True

    def __init__(self, dims: ModelDims, block: int = 256, memory: int = 256):
        super().__init__()
        if block < 1 or memory < 0:
            raise ValueError(f"attention.block={block} must be >= 1 and attention.memory="
                             f"{memory} >= 0")
        self.block, self.memory = block, memory

    def flex_pattern(self, t, s, causal, layer, heads) -> WindowPattern:
        return WindowPattern(self.memory, 0 if causal else self.memory, block=self.block)

    def band(self, s: int, layer: int) -> Band | None:
        """The fused CPU path's layout for S positions (:mod:`._ops.fused_band`)."""
        return Band(self.block, self.memory, sliding=False)

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
        return windowed_attention(q, k, v, block=self.block, before=self.memory,
                                  after=0 if causal else self.memory, causal=causal,
                                  sliding=False, bias=bias, key_padding_mask=key_padding_mask)
