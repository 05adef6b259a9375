"""ImageNet subsets (``data=imagenet``): Imagenette / Imagewoof (Howard 2019, 10 easy / 10 dog
classes of ImageNet), Tiny ImageNet (Le & Yang 2015, 200 classes at 64 x 64), or any local
ImageFolder (ImageNet itself included), for image classification with augmentation or for the
downsampled-ImageNet pixel LM.

Sources.  ``data.path=DIR``: the ImageFolder ``DIR/train/<class>/*.jpg`` + ``DIR/val/<class>/``
(:mod:`.image_folder`), whatever ``subset`` says.  Otherwise ``subset`` names a Hub dataset
(:data:`SUBSETS`; ``hf_repo`` / ``hf_config`` override the defaults), looked for under
``<data_dir>/imagenet/<subset>/`` as Parquet shards (``train-*.parquet``,
``validation-*.parquet``: the Hub's own files), a ``save_to_disk`` folder ``hf/``, or an
ImageFolder ``train/`` + ``val/``; else downloaded with ``datasets`` and saved as ``hf/``.
Offline with nothing there: one :class:`MissingDataError` line saying what to place where.

Cache.  The images are decoded once into ``<data_dir>/imagenet/<subset>/cache-<repo>-<config>/`` (an
ImageFolder: ``<data_dir>/imagenet/folders/<name>-<hash of its path>-<fingerprint>/``, the
fingerprint a digest of its listing's paths, sizes and modification times,
:func:`.image_folder.fingerprint`) as uint8 arrays that later runs memory-map
(:mod:`.image_cache`).  An ImageFolder is listed on every run (a ``stat`` per image, no image
read): a changed one is decoded into a new cache and the old one deleted; one that is gone is
read from its last cache.  Each image is stored as its
central square (``resize: crop``; ``squash``: the whole image squashed to a square, for
digits, documents or scans whose edges matter), resized: to ``cache_size`` (default
``resolution * 8 // 7``, the 256 / 224 of ImageNet evaluation) for ``classify``, to
``resolution`` with a box filter for ``pixel_lm``.

Splits.  The official validation images are the test split (ImageNet's test labels are not
public).  Validation is carved from the training images: ``round(val_fraction * n)`` images of
each class of ``n`` (at least 1, and never the class's last), drawn with a fixed seed
(:data:`VALIDATION_SEED`), so every run and every ``seed`` validates on the same images.

``mode: classify`` (:class:`ImageNetDataModule`): inputs float32 (B, 3, R, R) normalised with
ImageNet's mean and std, labels int64 (B,).  Training takes a random-resized crop (by default
8-100% of the area, ``crop_scale``; aspect 3/4-4/3, ``crop_ratio``) and a mirror with
probability ``flip`` (1/2) (:mod:`.image_transforms`), all drawn from the step's generator;
evaluation the central R x R of the cached image (R / cache_size = 224 / 256, as ImageNet's
resize-256 + centre-crop-224).  ``seq_len`` is ignored: the model's length comes
from the patches.  ``mode: pixel_lm``: the R x R x 3 sub-pixels in raster order, bits per
dimension (:mod:`.pixels`), the downsampled-ImageNet benchmark at R = 32 or 64 (van den Oord et
al. 2016); ``seq_len`` must be R * R * 3.

Simplifications: (1) the random-resized crop is taken from the cached central square at
``cache_size``, not from the full-resolution original, so it never sees the edges the square
cut off and its smallest crops are upsampled from fewer pixels; (2) pixel-LM images are the
central square box-filtered to R x R, where the official Imagenet32/64 files squash the whole
image to a square (Chrabaszcz et al. 2017; ``resize: squash``); (3) no colour jitter, mixup
or other augmentation.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from xformer_bench.data import hf_images, image_cache
from xformer_bench.data.download import offline
from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.data.image_cache import EncodedSplit
from xformer_bench.data.image_folder import (FINGERPRINT_DIGITS, Listing, fingerprint,
                                             is_image_folder, list_image_folder)
from xformer_bench.data.image_transforms import (CROP_RATIO, CROP_SCALE, FLIP, evaluation_view,
                                                 training_view)
from xformer_bench.data.pixels import PixelLMDataModule
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA

SUBSETS = {  # subset -> (Hub repo, its config): the defaults of data.hf_repo / data.hf_config
    "imagenette": ("frgfm/imagenette", "320px"),  # 9,469 / 3,925 images, shorter side 320 px
    "imagewoof": ("frgfm/imagewoof", "320px"),    # 9,025 / 3,929 images of 10 dog breeds
    "tiny_imagenet": ("zh-plus/tiny-imagenet", None),  # 100,000 / 10,000 at 64 x 64
}
MODES = ("classify", "pixel_lm")
RESIZES = ("crop", "squash")
VALIDATION_SEED = 0


class Rows:
    """The rows ``index`` of an array (a memory map stays one): ``shape``, ``dtype``, ``ndim``,
    ``len`` and ``rows[indices]`` as an array of those rows would give."""

    def __init__(self, array: np.ndarray, index: np.ndarray):
        self.array, self.index = array, np.asarray(index, dtype=np.int64)
        self.shape = (len(self.index), *array.shape[1:])
        self.dtype, self.ndim = array.dtype, array.ndim

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, indices) -> np.ndarray:
        return np.asarray(self.array[self.index[indices]])


@dataclass(frozen=True)
class Augmentation:
    """The training views' random crop (area ``scale`` and aspect ``ratio`` ranges) and the
    probability of their mirror: ``data.crop_scale``, ``data.crop_ratio``, ``data.flip``."""

    scale: tuple[float, float] = CROP_SCALE
    ratio: tuple[float, float] = CROP_RATIO
    flip: float = FLIP


class LabelledImages:
    """:class:`~.example_batches.Examples` of cached images (N, S, S, 3) uint8 with labels:
    ``(inputs float32 (B, 3, R, R), labels int64 (B,))``, augmented when given an ``rng``."""

    def __init__(self, images, labels: np.ndarray, resolution: int,
                 augmentation: Augmentation = Augmentation()):
        self.images, self.labels, self.resolution = images, labels, resolution
        self.augmentation = augmentation

    def __len__(self) -> int:
        return len(self.images)

    def batch(self, indices: np.ndarray, rng: np.random.Generator | None = None):
        pixels = np.asarray(self.images[indices])
        labels = torch.from_numpy(np.asarray(self.labels[indices], dtype=np.int64))
        if rng is None:
            return evaluation_view(pixels, self.resolution), labels
        a = self.augmentation
        views = [training_view(p, self.resolution, rng, a.scale, a.ratio, a.flip) for p in pixels]
        return torch.stack(views), labels


class ImageNetDataModule(ExampleDataModule):
    """Image classification (task ``classify``, input kind ``image``)."""

    task = "classify"
    unit = "examples"
    input_kind = "image"

    def __init__(self, splits, batch_size: int, seed: int, *, num_classes: int,
                 resolution: int, **loader):
        super().__init__(splits, batch_size, seed, **loader)
        self.num_classes, self.image_shape = num_classes, (3, resolution, resolution)


def carve_validation(labels: np.ndarray, fraction: float,
                     seed: int = VALIDATION_SEED) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``(train, val)`` indices: of each class's ``n`` images, ``round(fraction * n)``
    (at least 1, at most ``n - 1``) drawn for validation from ``(seed, class)``."""
    order = np.argsort(labels, kind="stable")
    classes, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
    held = []
    for label, start, n in zip(classes, starts, counts):
        k = min(int(n) - 1, max(1, round(fraction * n)))
        if k > 0:
            members = order[start:start + n]
            held.append(np.random.default_rng([seed, int(label)]).choice(members, k, replace=False))
    val = np.sort(np.concatenate(held)) if held else np.empty(0, dtype=np.int64)
    if not len(val):
        raise ConfigError("data.val_fraction: no class has 2 training images, so none can be "
                          "held out for validation")
    return np.setdiff1d(np.arange(len(labels)), val), val


def _check_augmentation(resize: str, augmentation: Augmentation) -> None:
    if resize not in RESIZES:
        raise ConfigError(f"data.resize={resize} must be one of: {', '.join(RESIZES)}")
    (low, high), (narrow, wide) = augmentation.scale, augmentation.ratio
    if not 0 < low <= high <= 1:
        raise ConfigError(f"data.crop_scale=[{low}, {high}] must be [low, high] with "
                          "0 < low <= high <= 1 (fractions of the image's area)")
    if not 0 < narrow <= wide:
        raise ConfigError(f"data.crop_ratio=[{narrow}, {wide}] must be [low, high] with "
                          "0 < low <= high (aspect ratios w / h)")
    if not 0 <= augmentation.flip <= 1:
        raise ConfigError(f"data.flip={augmentation.flip} must be a probability in [0, 1]")


def _check(mode, resolution, cache_size, val_fraction, seq_len, subset, path) -> None:
    if mode not in MODES:
        raise ConfigError(f"data.mode={mode} must be one of: {', '.join(MODES)}")
    if not (isinstance(resolution, int) and resolution >= 1):
        raise ConfigError(f"data.resolution={resolution} must be a positive int (pixels)")
    if cache_size is not None and not (isinstance(cache_size, int) and cache_size >= resolution):
        raise ConfigError(f"data.cache_size={cache_size} must be an int >= data.resolution="
                          f"{resolution} (or null: resolution * 8 // 7)")
    if not 0 < val_fraction < 1:
        raise ConfigError(f"data.val_fraction={val_fraction} must be between 0 and 1")
    dims = resolution * resolution * 3
    if mode == "pixel_lm" and seq_len != dims:
        raise ConfigError(f"data.seq_len={seq_len} but each {resolution}x{resolution}x3 image "
                          f"is {dims} sub-pixels: set data.seq_len={dims}")
    if path is None and subset not in SUBSETS:
        hint = "data.subset=folder needs data.path=DIR" if subset == "folder" else \
            f"data.subset={subset} must be one of: {', '.join([*SUBSETS, 'folder'])}"
        raise ConfigError(f"{hint} (an ImageFolder DIR/train/<class>/, DIR/val/<class>/)")


def _chunked(files: list[Path]):
    return (files[i:i + hf_images.CHUNK] for i in range(0, len(files), hf_images.CHUNK))


def _from_listing(listing: Listing):
    def source():
        classes, splits = listing
        return classes, {split: EncodedSplit(labels, lambda files=files: _chunked(files))
                         for split, (files, labels) in splits.items()}
    return source


def _folder_cache(root: Path, path: str, size: int, method: str):
    """``(cached, fingerprint)`` of the ImageFolder ``path`` as it is now (a changed folder is
    decoded anew and its older caches deleted); a folder that is gone: its last cache."""
    folder = Path(path).expanduser().resolve()
    stem = f"{folder.name}-{hashlib.sha1(str(folder).encode()).hexdigest()[:10]}"
    caches = root / "folders"
    ours = [c for c in caches.iterdir() if c.name == stem or c.name.startswith(f"{stem}-")] \
        if caches.is_dir() else []
    if not folder.exists():
        kept = [c for c in ours if image_cache.is_complete(c, size, method)]
        if kept:
            last = max(kept, key=lambda c: c.stat().st_mtime)
            return image_cache.load(last, size, method), last.name.removeprefix(stem)[1:] or None
    listing = list_image_folder(folder)
    digest = fingerprint(folder, listing)[:FINGERPRINT_DIGITS]
    cache = caches / f"{stem}-{digest}"
    loaded = image_cache.cached(cache, size, method, folder.name, _from_listing(listing))
    for stale in ours:
        if stale != cache:
            shutil.rmtree(stale, ignore_errors=True)
    return loaded, digest


def _from_subset(home: Path, subset: str, repo: str, config: str | None):
    def source():
        if shards := hf_images.parquet_shards(home):
            return hf_images.read_parquet(shards)
        if hf_images.is_saved_dataset(home / hf_images.SAVED):
            return hf_images.read_saved(home / hf_images.SAVED)
        if is_image_folder(home):
            return _from_listing(list_image_folder(home))()
        hint = (f"ImageNet subset {subset} not found: put its Parquet shards (train-*.parquet "
                f"and validation-*.parquet, or train/ and validation/ folders of them, from "
                f"https://huggingface.co/datasets/{repo}) in "
                f"{home.resolve()}, or place an ImageFolder (DIR/train/<class>/*.jpg, "
                f"DIR/val/<class>/*.jpg) and pass data.path=DIR")
        if offline():
            raise MissingDataError(hint + "; offline mode is on, so nothing was downloaded")
        try:
            return hf_images.download(repo, config, home / hf_images.SAVED)
        except Exception as error:  # noqa: BLE001 -- every failure is the same hint
            reason = f"{type(error).__name__}: {error}".splitlines()[0][:120]
            raise MissingDataError(f"{hint}; download failed ({reason})") from None
    return source


def load_images(data_dir: str | Path, *, subset: str, path: str | None, hf_repo: str | None,
                hf_config: str | None, size: int, method: str):
    """``((classes, {"train" | "test": (images (N, size, size, 3) uint8, labels (N,))}),
    fingerprint)`` from the cache, decoding the source into it first if need be; the
    fingerprint of an ImageFolder's content (``data.path``), else None."""
    root = Path(data_dir) / "imagenet"
    if path is not None:
        return _folder_cache(root, path, size, method)
    repo, config = SUBSETS[subset]
    repo, config = hf_repo or repo, hf_config if hf_repo or hf_config else config
    home = root / subset
    cache = home / f"cache-{repo.replace('/', '_')}-{config or 'default'}"
    return image_cache.cached(cache, size, method, subset,
                              _from_subset(home, subset, repo, config)), None


@DATA.register("imagenet")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, subset: str = "imagenette",
          path: str | None = None, hf_repo: str | None = None, hf_config: str | None = None,
          mode: str = "classify", resolution: int = 64, cache_size: int | None = None,
          val_fraction: float = 0.02, resize: str = "crop",
          crop_scale: tuple[float, float] = CROP_SCALE,
          crop_ratio: tuple[float, float] = CROP_RATIO, flip: float = FLIP, **loader):
    augmentation = Augmentation(tuple(crop_scale), tuple(crop_ratio), flip)
    _check(mode, resolution, cache_size, val_fraction, seq_len, subset, path)  # before any file
    _check_augmentation(resize, augmentation)
    pixel_lm = mode == "pixel_lm"
    size = resolution if pixel_lm else cache_size or resolution * 8 // 7
    method = ("box" if pixel_lm else "bilinear") + ("" if resize == "crop" else f"+{resize}")
    (classes, data), digest = load_images(data_dir, subset=subset, path=path, hf_repo=hf_repo,
                                          hf_config=hf_config, size=size, method=method)
    if len(classes) < 2:
        raise ConfigError(f"data=imagenet found {len(classes)} class(es); classification needs 2")
    (images, labels), (test_images, test_labels) = data["train"], data["test"]
    train, val = carve_validation(labels, val_fraction)
    if pixel_lm:
        splits = {"train": Rows(images, train), "val": Rows(images, val), "test": test_images}
        module = PixelLMDataModule(splits, batch_size, seed, seq_len=seq_len, **loader)
    else:
        splits = {"train": LabelledImages(Rows(images, train), labels[train], resolution,
                                          augmentation),
                  "val": LabelledImages(Rows(images, val), labels[val], resolution),
                  "test": LabelledImages(test_images, test_labels, resolution)}
        module = ImageNetDataModule(splits, batch_size, seed, num_classes=len(classes),
                                    resolution=resolution, **loader)
    module.data_fingerprint = digest  # the ImageFolder's content (None: a Hub subset)
    return module
