"""Shortening the sequence between stages: Funnel-Transformer (Dai, Lai, Yang & Le 2020,
NeurIPS) for bidirectional use, and its causal form with shifting, the Hourglass (Nawrot,
Tworkowski, Tyrolski, Kaiser, Wu, Szegedy & Michalewski 2022, "Hierarchical Transformers Are
More Efficient Language Models", Findings of NAACL).

Three stages of blocks, ``layers = (n_pre, n_short, n_post)`` (the Hourglass's
``(n_pre @ 1, n_short @ k, n_post @ 1)``; ``null``: n_layers / 4 at each end, the rest short):

    h     = pre-blocks(x)                                    (B, T, D)
    s     = shorten(h)                                       (B, T / k, D)
    s     = short-blocks(s)                                  (B, T / k, D)
    y     = post-blocks(upsample(s) + h)                     (B, T, D)

``shorten`` pools each group of k positions (``pooling: mean`` -- Funnel's mean pooling, and
the Hourglass's average pooling -- or ``linear``: the Hourglass's linear pooling, the k vectors
concatenated and projected, its best); ``upsample`` repeats each short vector k times (the
Hourglass's "naive" upsampling) or projects it to k vectors (``linear``), and the residual from
before shortening is added (both papers).

Causal use (``ctx.causal``): before pooling the sequence is shifted right by k - 1 positions
(zeros in front), so short position j summarises original positions jk - k + 1 .. jk and
upsampled position i reads short position floor(i / k): nothing from after i (the Hourglass's
shift, section 3.1).  A sequence whose length is not a multiple of k is padded at the end and
cut back.  Bidirectional use pools without the shift, as Funnel does.

Simplifications: Funnel's "pool-query-only" first attention of a stage (queries pooled, keys and
values not) and its relative-position details are not reproduced -- pooling happens between
blocks; the short blocks see positions through ``ctx.position`` at their own length (relative
schemes then measure distance in groups of k).  ``model.share_blocks`` applies one block at
every stage, ``model.checkpointing`` recomputes each; options whose weights are sized by
``data.seq_len`` (gMLP, mixer, synthesizer) fail on the short stage with their own length
error.  Not ``ordered_blocks``: RealFormer's logits cannot pass between lengths.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import STACK
from xformer_bench.stacks import Stack, apply_block, recomputes

KINDS = ("mean", "linear")


def _stage_sizes(layers: list[int] | None, n_layers: int) -> tuple[int, int, int]:
    if layers is None:
        end = max(n_layers // 4, 1) if n_layers >= 3 else 0
        return end, n_layers - 2 * end, end
    if len(layers) != 3 or min(layers) < 0 or layers[1] < 1:
        raise ConfigError(f"stack.layers={list(layers)} must be [n_pre, n_short, n_post] with "
                          "n_short >= 1 (null: n_layers/4 at each end)")
    if sum(layers) != n_layers:
        raise ConfigError(f"stack.layers={list(layers)} sums to {sum(layers)}, model.n_layers="
                          f"{n_layers}: make them agree")
    return tuple(layers)  # type: ignore[return-value]


@STACK.register("funnel")
class FunnelStack(Stack):
    def __init__(self, dims: ModelDims, make_block: Callable[[], nn.Module],
                 share_blocks: bool = False, checkpointing: bool = False, factor: int = 3,
                 layers: list[int] | None = None, pooling: str = "linear",
                 upsampling: str = "repeat"):
        super().__init__()
        if factor < 1 or pooling not in KINDS or upsampling not in ("repeat", "linear"):
            raise ConfigError(f"stack=funnel: factor={factor} must be >= 1, pooling one of "
                              f"{KINDS}, upsampling one of ('repeat', 'linear')")
        self.factor, self.pooling, self.upsampling = factor, pooling, upsampling
        self.sizes = _stage_sizes(layers, dims.n_layers)
        self.share_blocks, self.checkpointing = share_blocks, checkpointing
        self.blocks = nn.ModuleList(make_block() for _ in range(1 if share_blocks else dims.n_layers))
        d, k = dims.d_model, factor
        self.pool = nn.Linear(k * d, d) if pooling == "linear" else None  # (k D) -> D
        self.unpool = nn.Linear(d, k * d) if upsampling == "linear" else None  # D -> (k D)

    def _run(self, x: torch.Tensor, ctx: ForwardContext, first: int, count: int) -> torch.Tensor:
        recompute = recomputes(self)
        for i in range(first, first + count):
            layer = 0 if self.share_blocks else i
            x = apply_block(self.blocks[layer], x, ctx, layer, recompute=recompute)
        return x

    def shorten(self, h: torch.Tensor, causal: bool) -> torch.Tensor:  # (B, T, D) -> (B, T/k, D)
        b, t, d = h.shape
        k = self.factor
        if causal:  # the Hourglass's shift: group j ends at original position j k
            h = F.pad(h, (0, 0, k - 1, 0))[:, :t]
        h = F.pad(h, (0, 0, 0, -t % k))  # (B, k ceil(T/k), D)
        groups = h.view(b, -1, k, d)  # (B, T/k, k, D)
        return self.pool(groups.flatten(2)) if self.pool is not None else groups.mean(2)

    def upsample(self, s: torch.Tensor, t: int) -> torch.Tensor:  # (B, T/k, D) -> (B, T, D)
        k = self.factor
        if self.unpool is not None:
            up = self.unpool(s).unflatten(-1, (k, s.shape[-1])).flatten(1, 2)  # (B, k T/k, D)
        else:
            up = s.repeat_interleave(k, dim=1)  # (B, k T/k, D)
        return up[:, :t]

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        n_pre, n_short, n_post = self.sizes
        key_padding_mask = ctx.key_padding_mask
        h = self._run(x, ctx, 0, n_pre)
        s = self.shorten(h, ctx.causal)
        if key_padding_mask is not None:  # a group is padding only if all of it is
            groups = F.pad(key_padding_mask, (0, -key_padding_mask.shape[1] % self.factor),
                           value=True)
            ctx.key_padding_mask = groups.view(groups.shape[0], -1, self.factor).all(-1)
        s = self._run(s, ctx, n_pre, n_short)
        ctx.key_padding_mask = key_padding_mask
        return self._run(self.upsample(s, x.shape[1]) + h, ctx, n_pre + n_short, n_post)
