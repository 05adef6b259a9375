"""Image transforms for classification batches, in torch and numpy (no torchvision): the
Inception-style random-resized crop and horizontal flip for training, the centre crop for
evaluation, and the ImageNet normalisation.

By default training crops follow Szegedy et al. 2015 ("Going deeper with convolutions",
section 6) as torchvision's ``RandomResizedCrop`` implements them: a box of 8% to 100% of the
image's area and aspect ratio in [3/4, 4/3] (drawn log-uniformly), at most 10 tries, else the
largest centred box of an allowed aspect ratio; the box is resized to ``size`` x ``size``
bilinearly with antialiasing, then mirrored with probability 1/2.  The area and ratio ranges and
the mirror's probability are the data option's keys (``data.crop_scale``, ``data.crop_ratio``,
``data.flip``).  Every random number comes from the numpy ``Generator`` handed in, so a batch
depends only on that generator (:mod:`.example_batches` draws it from the seed and step).

Images arrive as uint8 (H, W, 3) or (B, H, W, 3), channels last; outputs are float32
(3, size, size) or (B, 3, size, size), channels first, values 0..255 until :func:`normalise`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # per-channel mean and std of ImageNet's training
IMAGENET_STD = (0.229, 0.224, 0.225)   # images, on the 0..1 scale (the common constants)
CROP_SCALE = (0.08, 1.0)
CROP_RATIO = (3 / 4, 4 / 3)
CROP_TRIES = 10


def random_resized_crop_box(height: int, width: int, rng: np.random.Generator,
                            scale: tuple[float, float] = CROP_SCALE,
                            ratio: tuple[float, float] = CROP_RATIO) -> tuple[int, int, int, int]:
    """``(top, left, h, w)`` of a random box inside a ``height`` x ``width`` image: area a
    fraction U(scale) of the image's, aspect ratio w / h log-uniform in ``ratio``."""
    area = height * width
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(CROP_TRIES):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_lo, log_hi))
        w = int(round(math.sqrt(target * aspect)))
        h = int(round(math.sqrt(target / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    aspect = width / height  # fallback: the whole image, cut to the nearest allowed ratio
    if aspect < ratio[0]:
        w, h = width, int(round(width / ratio[0]))
    elif aspect > ratio[1]:
        w, h = int(round(height * ratio[1])), height
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def to_channels_first(pixels: np.ndarray) -> torch.Tensor:
    """uint8 (..., H, W, C) -> float32 (..., C, H, W), values 0..255."""
    return torch.from_numpy(np.ascontiguousarray(pixels)).movedim(-1, -3).float()


def resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """float (B, C, H, W) -> (B, C, size, size): bilinear, antialiased when shrinking."""
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False,
                         antialias=True)


def random_resized_crop(image: np.ndarray, size: int, rng: np.random.Generator,
                        scale: tuple[float, float] = CROP_SCALE,
                        ratio: tuple[float, float] = CROP_RATIO) -> torch.Tensor:
    """uint8 (H, W, 3) -> float32 (3, size, size): a random box (:func:`random_resized_crop_box`)
    resized to ``size``."""
    top, left, h, w = random_resized_crop_box(image.shape[0], image.shape[1], rng, scale, ratio)
    box = to_channels_first(image[top:top + h, left:left + w])
    return resize(box[None], size)[0]


def random_flip(image: torch.Tensor, rng: np.random.Generator, p: float = 0.5) -> torch.Tensor:
    """``image`` (..., H, W) mirrored left-right with probability ``p``."""
    return image.flip(-1) if rng.random() < p else image


def centre_crop(images: np.ndarray, size: int) -> np.ndarray:
    """The central ``size`` x ``size`` pixels of (..., H, W, C) images (rounded as torchvision's
    ``CenterCrop``)."""
    height, width = images.shape[-3], images.shape[-2]
    if size > min(height, width):
        raise ValueError(f"cannot centre-crop {size} pixels from {height}x{width} images")
    top, left = int(round((height - size) / 2)), int(round((width - size) / 2))
    return images[..., top:top + size, left:left + size, :]


def normalise(images: torch.Tensor, mean: tuple[float, ...] = IMAGENET_MEAN,
              std: tuple[float, ...] = IMAGENET_STD) -> torch.Tensor:
    """float (..., C, H, W) with values 0..255 -> (x / 255 - mean) / std per channel."""
    shape = (len(mean), 1, 1)
    mean_t = torch.tensor(mean, dtype=images.dtype).view(shape)
    std_t = torch.tensor(std, dtype=images.dtype).view(shape)
    return (images / 255.0 - mean_t) / std_t


FLIP = 0.5


def training_view(image: np.ndarray, size: int, rng: np.random.Generator,
                  scale: tuple[float, float] = CROP_SCALE, ratio: tuple[float, float] = CROP_RATIO,
                  flip: float = FLIP) -> torch.Tensor:
    """One augmented training input: random-resized crop (``scale``, ``ratio``), then a mirror
    with probability ``flip``, normalised (``data.crop_scale``, ``crop_ratio``, ``flip``)."""
    return normalise(random_flip(random_resized_crop(image, size, rng, scale, ratio), rng, flip))


def evaluation_view(images: np.ndarray, size: int) -> torch.Tensor:
    """uint8 (B, H, W, 3) -> float32 (B, 3, size, size): the centre crop, normalised."""
    return normalise(to_channels_first(centre_crop(images, size)))
