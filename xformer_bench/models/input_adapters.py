"""Input adapters: what turns a task's inputs into the (B, N, D) sequence the body mixes.

* tokens -- the ``embedding`` option (:mod:`xformer_bench.embedding`: bytes, sub-pixel values,
  ListOps symbols); sub-pixels get their per-axis positions from ``position=factorized``
  with the data's layout (row, column, channel).
* patches -- :class:`PatchEmbedding`: ViT's linear projection of non-overlapping P x P
  patches (Dosovitskiy et al. 2021, eq. 1), raster order, as one strided convolution.
* :class:`ClassToken` -- ViT's / BERT's learned [CLS] vector prepended to the sequence, whose
  final state the classifier reads (``model.pool=cls``).
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.init import mark_initialised


def patch_grid(image_shape: tuple[int, int, int], patch_size: int) -> tuple[int, int]:
    """Patches per column and per row of (C, H, W) images; a ConfigError if P divides neither."""
    _, h, w = image_shape
    if h % patch_size or w % patch_size:
        raise ConfigError(f"model.patch_size={patch_size} must divide the {h}x{w} images: "
                          f"choose a divisor of {h} and {w}")
    return h // patch_size, w // patch_size


class PatchEmbedding(nn.Module):
    """(B, C, H, W) -> (B, H/P * W/P, D): ``x_p E + b`` for each flattened patch ``x_p``."""

    def __init__(self, image_shape: tuple[int, int, int], patch_size: int, d_model: int):
        super().__init__()
        self.grid = patch_grid(image_shape, patch_size)
        channels = image_shape[0]
        self.project = nn.Conv2d(channels, d_model, kernel_size=patch_size, stride=patch_size)
        fan_in = channels * patch_size ** 2  # LeCun normal, as ViT's jax init of the embedding
        nn.init.normal_(self.project.weight, std=fan_in ** -0.5)
        nn.init.zeros_(self.project.bias)

    @property
    def n_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    def forward(self, images: torch.Tensor) -> torch.Tensor:  # (B, C, H, W) -> (B, N, D)
        return self.project(images).flatten(2).transpose(1, 2)


class ClassToken(nn.Module):
    """Prepends one learned vector: (B, N, D) -> (B, 1 + N, D)."""

    def __init__(self, d_model: int):
        super().__init__()
        self.vector = nn.Parameter(torch.randn(d_model) * d_model ** -0.5)
        mark_initialised(self.vector)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.vector.expand(x.shape[0], 1, -1), x], dim=1)
