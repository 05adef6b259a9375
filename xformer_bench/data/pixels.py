"""Images as language-modelling sequences (the Sparse Transformer's and Image Transformer's
pixel LM): each image a sequence of its H x W x C sub-pixel bytes in raster order, channels
interleaved (row 0 column 0 red, green, blue, row 0 column 1 red, ...), scored in bits per
dimension = mean cross-entropy / ln 2 over every sub-pixel (Child et al. 2019, section 7.1;
Parmar et al. 2018).

So that the first sub-pixel is predicted too, each input sequence starts with a
beginning-of-image token ``BOS_ID = 256`` (vocabulary 257; the token is never a target):
inputs ``[BOS, x_0, ..., x_{n-2}]``, targets ``[x_0, ..., x_{n-1}]``.
"""

from __future__ import annotations

import numpy as np
import torch

from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.errors import ConfigError

BOS_ID = 256
VOCAB_SIZE = 257


class PixelSequences:
    """:class:`~xformer_bench.data.example_batches.Examples` over uint8 images (N, H, W, C)
    (a memory map is read only where indexed)."""

    def __init__(self, images: np.ndarray):
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 (N, H, W, C), got {images.dtype} {images.shape}")
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def batch(self, indices: np.ndarray, rng=None) -> tuple[torch.Tensor, torch.Tensor]:
        flat = torch.from_numpy(np.asarray(self.images[indices]).reshape(len(indices), -1))
        targets = flat.long()  # (B, H*W*C)
        bos = torch.full((len(indices), 1), BOS_ID, dtype=torch.long)
        return torch.cat([bos, targets[:, :-1]], dim=1), targets


def downsample(images: np.ndarray, size: int) -> np.ndarray:
    """(N, H, W, C) uint8 -> (N, size, size, C) by averaging ``H / size`` x ``W / size``
    boxes (the box filter of the downsampled-ImageNet benchmarks, van den Oord et al. 2016),
    rounded; ``size`` must divide both sides."""
    n, h, w, c = images.shape
    if size == h == w:
        return images
    if h % size or w % size:
        raise ConfigError(f"data.resolution={size} must divide the images' {h}x{w} pixels")
    boxes = images.reshape(n, size, h // size, size, w // size, c).astype(np.float32)
    return np.rint(boxes.mean(axis=(2, 4))).astype(np.uint8)


class PixelLMDataModule(ExampleDataModule):
    """Pixel LM over ``train`` / ``val`` / ``test`` images (N, H, W, C) uint8."""

    task = "lm"
    unit = "dims"
    vocab_size = VOCAB_SIZE
    bos_id = BOS_ID

    def __init__(self, images: dict[str, np.ndarray], batch_size: int, seed: int,
                 seq_len: int | None = None, **loader):
        _, h, w, c = images["train"].shape
        self.layout = (h, w, c)
        if seq_len is not None and seq_len != h * w * c:
            raise ConfigError(f"data.seq_len={seq_len} but each {h}x{w}x{c} image is "
                              f"{h * w * c} sub-pixels: set data.seq_len={h * w * c}")
        super().__init__({split: PixelSequences(array) for split, array in images.items()},
                         batch_size, seed, **loader)
