"""Positions as coordinates on a grid, for the per-axis learned embeddings (``axial``,
``factorized``): position ``i`` of a row-major grid of shape ``(n_1, ..., n_k)`` has
coordinates ``(i // (n_2 ... n_k) % n_1, ..., i % n_k)``."""

from __future__ import annotations

import math

import torch

from xformer_bench.errors import ConfigError


def default_grid(seq_len: int) -> tuple[int, int]:
    """A near-square 2-D grid covering ``seq_len`` positions: (ceil(T / l), l), l = ceil(sqrt T)
    -- the layout of the Sparse Transformer's strided pattern for 1-D data."""
    width = math.ceil(math.sqrt(seq_len))
    return math.ceil(seq_len / width), width


def grid_shape(shape: list[int] | None, seq_len: int, option: str) -> tuple[int, ...]:
    """The grid asked for (``position.shape``), checked, or :func:`default_grid`."""
    if shape is None:
        return default_grid(seq_len)
    grid = tuple(int(n) for n in shape)
    if not grid or min(grid) < 1:
        raise ConfigError(f"position={option}: shape={list(shape)} needs positive axis sizes")
    return grid


def coordinates(t: int, grid: tuple[int, ...], option: str,
                device: torch.device) -> list[torch.Tensor]:
    """One (T,) long tensor per axis: the coordinates of positions 0 .. t-1."""
    if t > math.prod(grid):
        raise ConfigError(f"position={option} covers {math.prod(grid)} positions (shape="
                          f"{list(grid)}), the input has {t}: set position.shape to a grid of "
                          f"at least {t} cells")
    index = torch.arange(t, device=device)
    coords, stride = [], math.prod(grid)
    for n in grid:
        stride //= n
        coords.append(index // stride % n)
    return coords
