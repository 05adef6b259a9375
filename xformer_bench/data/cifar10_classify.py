"""CIFAR-10 classification from pixel tokens: the Long Range Arena "image" task (Tay et al.
2021, "Long Range Arena: A Benchmark for Efficient Transformers").  Each image is a sequence of
its 32 x 32 = 1024 grey levels in raster order, tokens 0..255 (vocabulary 256, no padding: every
sequence is full length), classified into the 10 CIFAR-10 classes by an encoder; no
augmentation, as in LRA.  ``channels: rgb`` keeps the colour instead: 3072 sub-pixel tokens in
raster order, channels interleaved (row 0 column 0 red, green, blue, row 0 column 1 red, ...).

Grey level = ITU-R BT.601 luma ``0.299 R + 0.587 G + 0.114 B``, rounded half up, in integer
arithmetic (:func:`to_gray`).  LRA's pipeline converts with ``tf.image.rgb_to_grayscale``
(weights 0.2989, 0.5870, 0.1140, then a truncating conversion back to uint8), which can differ
from this by one grey level.

Files, cache and splits are :mod:`.cifar10`'s: the last ``val_size`` official training images
are validation.  LRA held out the last 10% (``train[90%:]`` of TensorFlow Datasets, 45,000 /
5,000 / 10,000): ``val_size: 5000``.
"""

from __future__ import annotations

import numpy as np
import torch

from xformer_bench.data.cifar10 import NUM_CLASSES, SIDE, standard_splits
from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DATA

SEQUENCE_LENGTH = {"gray": SIDE * SIDE, "rgb": SIDE * SIDE * 3}
LUMA_PER_MILLE = np.array([299, 587, 114], dtype=np.int32)  # BT.601 weights x 1000, sum 1000


def to_gray(images: np.ndarray) -> np.ndarray:
    """(..., 3) uint8 RGB -> (...) uint8 BT.601 luma, rounded half up."""
    return ((images.astype(np.int32) @ LUMA_PER_MILLE + 500) // 1000).astype(np.uint8)


class ImageTokens:
    """:class:`~xformer_bench.data.example_batches.Examples` over images (N, H, W, 3) uint8
    and labels (N,): batches ``(tokens int64 (B, H*W) or (B, H*W*3), labels int64 (B,))``."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, channels: str = "gray"):
        if channels not in SEQUENCE_LENGTH:
            raise ConfigError(f"data.channels={channels} must be one of: "
                              f"{', '.join(SEQUENCE_LENGTH)}")
        self.images, self.labels, self.channels = images, labels, channels

    def __len__(self) -> int:
        return len(self.images)

    def batch(self, indices: np.ndarray, rng=None) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = np.asarray(self.images[indices])  # (B, H, W, 3); no augmentation, rng unused
        if self.channels == "gray":
            pixels = to_gray(pixels)
        tokens = torch.from_numpy(pixels.reshape(len(indices), -1).astype(np.int64))
        return tokens, torch.from_numpy(np.asarray(self.labels[indices], dtype=np.int64))


class CIFAR10ClassifyDataModule(ExampleDataModule):
    """Token sequences of CIFAR-10 images with their classes (task ``classify``)."""

    task = "classify"
    unit = "examples"
    input_kind = "tokens"
    num_classes = NUM_CLASSES
    vocab_size = 256
    pad_id = None


@DATA.register("cifar10_classify")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, channels: str = "gray",
          val_size: int = 5000, **loader) -> CIFAR10ClassifyDataModule:
    if channels not in SEQUENCE_LENGTH:
        raise ConfigError(f"data.channels={channels} must be one of: {', '.join(SEQUENCE_LENGTH)}")
    if seq_len != SEQUENCE_LENGTH[channels]:
        raise ConfigError(f"data.seq_len={seq_len} but data.channels={channels} makes each image "
                          f"{SEQUENCE_LENGTH[channels]} tokens: set data.seq_len="
                          f"{SEQUENCE_LENGTH[channels]}")
    splits = {split: ImageTokens(images, labels, channels)
              for split, (images, labels) in standard_splits(data_dir, val_size).items()}
    return CIFAR10ClassifyDataModule(splits, batch_size, seed, **loader)
