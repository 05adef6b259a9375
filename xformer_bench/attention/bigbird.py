"""BigBird attention (Zaheer et al. 2020, "Big Bird: Transformers for Longer Sequences",
section 2 and appendix D, the blocked ITC form): the sequence is cut into blocks of ``block``
positions, and each query block attends

* ``window_blocks`` neighbouring blocks -- centred on its own (1 on each side at the default
  3), or, in causal mode, its own and the ``window_blocks - 1`` before it;
* ``global_blocks`` global blocks, here the **first** ones (BigBird-ITC makes the first and
  the last block global; the first ones keep causal mode causal), which also attend every key;
* ``random_blocks`` random blocks, drawn among the blocks that are neither in its window nor
  global -- in causal mode among the blocks before its window only.

The random blocks are fixed per layer, as in the paper's implementation (which seeds its draw
with the layer index): drawn from a generator seeded with ``seed`` and the ``layer`` index,
never from the global random state, so a layer sees the same pattern in training and
evaluation, run after run.  Simplification: the heads of a layer share one draw (the paper's
code draws per head).  A block with fewer candidates than ``random_blocks`` takes them all.

Computed blockwise: each query block's window blocks, the global blocks and its random blocks
are gathered side by side and one softmax runs over all
(:func:`~xformer_bench.attention._ops.window.windowed_attention`): O(T * b * (window + global +
random blocks)); the global blocks' query rows are a dense pass over those rows only, O(g * T)
(O(g^2) when causal).

Causal on CPU (no bias, no key padding) it runs as fused kernel calls (:mod:`._ops.fused_band`):
the window's rows, one call for the global keys past the window's reach and one per query
block and random block, nothing gathered or stored but the output and its normaliser.

torch.compile: not one graph (the random key blocks are drawn from a torch.Generator made in the
forward (one stream per seed and layer); tests/test_compile.py).
"""

from __future__ import annotations

import math

import torch

from xformer_bench.attention import EXACT_ATTENTION, AttentionKernel
from xformer_bench.attention._ops.fused_band import Band, fused_band_on_cpu
from xformer_bench.attention._ops.flex import WindowPattern, flex_dispatch
from xformer_bench.attention._ops.window import windowed_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


@ATTENTION.register("bigbird")
class BigBirdAttention(AttentionKernel):
    provides = EXACT_ATTENTION - {"longer_keys"}  # blocks are positions of one sequence
    sub_quadratic = True

    def __init__(self, dims: ModelDims, block: int = 64, window_blocks: int = 3,
                 global_blocks: int = 2, random_blocks: int = 3, seed: int = 0):
        super().__init__()
        if block < 1 or window_blocks < 1 or global_blocks < 0 or random_blocks < 0:
            raise ValueError("attention.block and attention.window_blocks must be >= 1, "
                             "attention.global_blocks and attention.random_blocks >= 0")
        self.block, self.window_blocks = block, window_blocks
        self.global_blocks, self.random_blocks, self.seed = global_blocks, random_blocks, seed
        self._random_rows: dict[tuple[int, int], tuple[tuple[int, ...], ...]] = {}

    def window_reach(self, causal: bool) -> tuple[int, int]:
        """Window blocks before and after a query block's own."""
        before = self.window_blocks - 1 if causal else self.window_blocks // 2
        return before, self.window_blocks - 1 - before

    def random_key_blocks(self, n_blocks: int, causal: bool, layer: int) -> torch.Tensor:
        """(nb, random_blocks): distinct blocks outside the window and the global blocks --
        in causal mode before the window -- drawn per (seed, layer); -1 = none left."""
        before, after = self.window_reach(causal)
        query_block = torch.arange(n_blocks)[:, None]  # (nb, 1)
        candidate = torch.arange(n_blocks)[None, :]  # (1, nb)
        outside = (candidate < query_block - before) | (candidate > query_block + after)
        allowed = outside & (candidate >= self.global_blocks)  # (nb, nb)
        if causal:
            allowed = allowed & (candidate < query_block)
        n_random = min(self.random_blocks, n_blocks)
        # one stream per (seed, layer), never the global random state
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + layer)
        draw = torch.rand(n_blocks, n_blocks, generator=generator).masked_fill(~allowed, 2.0)
        picked = draw.topk(n_random, dim=-1, largest=False)  # (nb, r)
        return picked.indices.masked_fill(picked.values > 1.0, -1)

    def flex_pattern(self, t, s, causal, layer, heads) -> WindowPattern:
        before, after = self.window_reach(causal)
        random = self.random_key_blocks(math.ceil(t / self.block), causal, layer)
        return WindowPattern(before * self.block, after * self.block, block=self.block,
                             n_global=self.global_blocks * self.block,
                             random=tuple(map(tuple, random.tolist())))

    def band(self, s: int, layer: int) -> Band:
        """The fused CPU path's layout for S positions (:mod:`._ops.fused_band`), causal."""
        before, _ = self.window_reach(causal=True)
        return Band(self.block, before * self.block, sliding=False,
                    n_global=self.global_blocks * self.block,
                    random=self.random_rows(math.ceil(s / self.block), layer))

    def random_rows(self, n_blocks: int, layer: int) -> tuple[tuple[int, ...], ...]:
        """:meth:`random_key_blocks`, causal, as plain tuples (drawn once per length and layer,
        kept on the kernel: a class-level cache would keep every kernel alive)."""
        key = (n_blocks, layer)
        if key not in self._random_rows:
            self._random_rows[key] = tuple(map(tuple, self.random_key_blocks(
                n_blocks, True, layer).tolist()))
        return self._random_rows[key]

    @flex_dispatch
    @fused_band_on_cpu
    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, T, Dh)
        v: torch.Tensor,  # (B, H, T, Dh)
        *,
        causal: bool,
        bias: PairBias | None = None,
        key_padding_mask: torch.Tensor | None = None,  # (B, T) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        t, b = q.shape[-2], self.block
        if k.shape[-2] != t:
            raise ValueError(f"bigbird attends one sequence: {t} queries, {k.shape[-2]} keys")
        random = self.random_key_blocks(math.ceil(t / b), causal, layer).to(q.device)  # (nb, r)
        index = random[:, :, None] * b + torch.arange(b, device=q.device)  # (nb, r, b)
        index = index.masked_fill((random[:, :, None] < 0) | (index >= t), -1).flatten(1)
        before, after = self.window_reach(causal)
        return windowed_attention(q, k, v, block=b, before=before * b, after=after * b,
                                  causal=causal, sliding=False, n_global=self.global_blocks * b,
                                  extra_keys=index if index.numel() else None, bias=bias,
                                  key_padding_mask=key_padding_mask)
