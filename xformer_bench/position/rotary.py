"""Rotary position embedding, RoPE (Su, Lu, Pan, Murtadha, Wen & Liu 2021, RoFormer).

Each pair of dimensions ``(2p, 2p+1)`` of a query or key at position ``m`` is rotated by
the angle ``m * base^(-2p / Dh)``.  A rotation by ``m`` then one by ``-n`` is a rotation by
``m - n``, so ``q_m . k_n`` depends on the positions only through ``m - n``.
"""

from __future__ import annotations

import torch

from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.registry import POSITION


@POSITION.register("rotary")
class RotaryPosition(Position):
    requires = {"attention": frozenset({"queries_and_keys"})}

    def __init__(self, dims: ModelDims, base: float = 10000.0):
        super().__init__()
        if dims.head_dim % 2:
            raise ValueError(f"rotary position needs an even head_dim, got {dims.head_dim}")
        pair_index = torch.arange(0, dims.head_dim, 2).double()  # 2p, (Dh/2,)
        frequencies = base ** (-pair_index / dims.head_dim)  # (Dh/2,)
        self.frequencies = frequencies  # (Dh/2,) float64
        self._tabulate(dims.seq_len)

    def _tabulate(self, length: int) -> None:
        """cos and sin of the angles of positions 0 .. length - 1 (computed in float64)."""
        device = getattr(self, "cos", torch.empty(0)).device
        angles = torch.arange(length).double()[:, None] * self.frequencies  # (T, Dh/2)
        self.register_buffer("cos", angles.cos().float().to(device), persistent=False)  # (T, Dh/2)
        self.register_buffer("sin", angles.sin().float().to(device), persistent=False)  # (T, Dh/2)

    def rotate_at(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Rotate ``x`` (B, H, T, Dh) whose rows sit at positions ``start .. start + T - 1``;
        positions past the table (memory, longer evaluation) grow it once."""
        t = x.shape[-2]
        if start + t > len(self.cos):
            self._tabulate(start + t)
        cos = self.cos[start : start + t].to(x.dtype)  # (T, Dh/2)
        sin = self.sin[start : start + t].to(x.dtype)  # (T, Dh/2)
        pairs = x.unflatten(-1, (-1, 2))  # (B, H, T, Dh/2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]  # (B, H, T, Dh/2) each
        rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
        return rotated.flatten(-2)  # (B, H, T, Dh)

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t_query, t_key = q.shape[-2], k.shape[-2]  # queries are the last t_query positions
        return self.rotate_at(q, t_key - t_query), self.rotate_at(k, 0)

    def rotate_from(self, q: torch.Tensor, k: torch.Tensor,
                    start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached decoding: this step's queries and keys both sit at ``start ..`` (the cached
        keys were rotated at their own positions when they were new)."""
        return self.rotate_at(q, start), self.rotate_at(k, start)
