"""Decoding encoded images (PNG / JPEG files or bytes) once into a uint8 cache that later runs
memory-map, so that batches only slice arrays.

Each image is decoded with PIL, converted to RGB, and its central square (side = the shorter
side) resized to ``size`` x ``size`` -- the same pixels as resizing the shorter side to
``size`` then centre-cropping, in one resampling; or, for a ``method`` ending in ``+squash``,
the whole image -- with the ``bilinear`` (antialiased when shrinking, as PIL's filters are) or
``box`` (area-average) filter.  Large JPEGs are decoded at a reduced scale first (PIL's
``draft``: 1/2, 1/4 or 1/8, never below ``size``).

A cache folder holds, per split, ``<split>_<size>px_<method>.npy`` (N, size, size, 3) uint8
and ``<split>_labels.npy`` (N,) int64, and ``classes.json`` (the class names, written last).
Every file is written under a temporary name (one per process: ranks may race) then renamed,
so a file that exists is complete; the images are written straight into a memory-mapped file,
so decoding holds one chunk of images in memory, not the split.
"""

from __future__ import annotations

import io
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import numpy as np
from PIL import Image
from tqdm import tqdm

from xformer_bench.errors import MissingDataError

Encoded = Union[Path, bytes, dict]
"""An encoded image: a file, its bytes, or a Hugging Face image cell ``{"bytes", "path"}``."""

FILTERS = {"bilinear": Image.Resampling.BILINEAR, "box": Image.Resampling.BOX}
SPLITS = ("train", "test")
THREADS = min(8, os.cpu_count() or 1)  # PIL releases the GIL while decoding and resizing


@dataclass
class EncodedSplit:
    """One split before decoding: its labels and its encoded images, in the same order, read
    a chunk at a time (``chunks()`` starts from the first image on each call)."""

    labels: np.ndarray
    chunks: Callable[[], Iterator[Sequence[Encoded]]]


def _describe(image: Encoded) -> str:
    if isinstance(image, dict):
        return str(image.get("path") or "an embedded image")
    return str(image) if isinstance(image, Path) else "an embedded image"


def open_image(image: Encoded) -> Image.Image:
    """The PIL image (not yet decoded) of a file, bytes or ``{"bytes", "path"}`` cell."""
    if isinstance(image, dict):
        image = image["bytes"] if image.get("bytes") is not None else Path(image["path"])
    return Image.open(io.BytesIO(image) if isinstance(image, bytes) else image)


def square_pixels(image: Encoded, size: int, method: str = "bilinear") -> np.ndarray:
    """uint8 (size, size, 3): the RGB central square of ``image`` resized to ``size`` --
    or, where ``method`` ends in ``+squash`` (``bilinear+squash``), the whole image."""
    filter_name, _, how = method.partition("+")
    try:
        with open_image(image) as opened:
            width, height = opened.size
            if opened.format == "JPEG":  # decode at the smallest scale still >= size
                scale = size / min(width, height)
                opened.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
                width, height = opened.size
            rgb = opened.convert("RGB")
    except (OSError, ValueError, KeyError, TypeError, Image.DecompressionBombError) as error:
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:120]
        raise MissingDataError(f"{_describe(image)} is not a readable image ({reason}): "
                               "replace or delete it") from None
    side = min(width, height)
    box = None if how == "squash" else \
        ((width - side) / 2, (height - side) / 2, (width + side) / 2, (height + side) / 2)
    return np.asarray(rgb.resize((size, size), FILTERS[filter_name], box=box), dtype=np.uint8)


def _images_path(folder: Path, split: str, size: int, method: str) -> Path:
    return folder / f"{split}_{size}px_{method}.npy"


def _labels_path(folder: Path, split: str) -> Path:
    return folder / f"{split}_labels.npy"


def _partial(path: Path) -> Path:
    return path.with_name(f".{path.name}.{os.getpid()}.part")


def _save_array(path: Path, array: np.ndarray) -> None:
    with open(path, "wb") as out:  # a file object: np.save would append .npy to the name
        np.save(out, array)


def _save_atomically(path: Path, write: Callable[[Path], None]) -> None:
    partial = _partial(path)
    try:
        write(partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def _decode_split(path: Path, split: EncodedSplit, size: int, method: str, what: str) -> None:
    count = len(split.labels)

    def write(partial: Path) -> None:
        out = np.lib.format.open_memmap(partial, mode="w+", dtype=np.uint8,
                                        shape=(count, size, size, 3))
        done = 0
        with ThreadPoolExecutor(THREADS) as pool, \
                tqdm(total=count, unit="img", desc=f"decoding {what}", disable=None) as bar:
            for chunk in split.chunks():
                pixels = list(pool.map(lambda image: square_pixels(image, size, method), chunk))
                if done + len(pixels) > count:
                    break
                out[done:done + len(pixels)] = np.stack(pixels)
                done += len(pixels)
                bar.update(len(pixels))
        out.flush()
        del out
        if done != count:
            raise MissingDataError(f"{what}: {count} labels but a different number of images; "
                                   "the source is damaged")

    _save_atomically(path, write)


def is_complete(folder: Path, size: int, method: str) -> bool:
    """Whether ``folder`` holds every split at ``size`` and ``method``."""
    return (folder / "classes.json").is_file() and all(
        _images_path(folder, s, size, method).is_file() and _labels_path(folder, s).is_file()
        for s in SPLITS)


Cached = tuple[list[str], dict[str, tuple[np.ndarray, np.ndarray]]]
"""Class names and, per split, images (N, size, size, 3) uint8 and labels (N,) int64."""


def load(folder: Path, size: int, method: str) -> Cached:
    """``(classes, {split: (images (N, size, size, 3) uint8 memory map, labels (N,) int64)})``."""
    classes = json.loads((folder / "classes.json").read_text())
    out = {}
    for split in SPLITS:
        images = np.load(_images_path(folder, split, size, method), mmap_mode="r")
        labels = np.load(_labels_path(folder, split))
        if (images.dtype != np.uint8 or images.shape[1:] != (size, size, 3)
                or labels.shape != (len(images),) or labels.max(initial=0) >= len(classes)):
            raise MissingDataError(f"the image cache {folder} is damaged: delete that folder and "
                                   "run again to decode the images anew")
        out[split] = (images, labels)
    return classes, out


def cached(folder: Path, size: int, method: str, what: str,
           source: Callable[[], tuple[list[str] | None, dict[str, EncodedSplit]]]) -> Cached:
    """The cache in ``folder`` at ``size`` and ``method`` (:func:`load`); when incomplete,
    ``source()`` (class names and the ``train`` / ``test`` :class:`EncodedSplit`) is decoded
    into it first.  ``what`` names the data in the progress bar and errors."""
    folder = Path(folder)
    if not is_complete(folder, size, method):
        classes, splits = source()
        top = max(int(splits[name].labels.max(initial=-1)) for name in SPLITS)
        classes = list(classes) if classes else [str(label) for label in range(top + 1)]
        for name in SPLITS:
            labels = splits[name].labels
            if not len(labels) or labels.min() < 0 or labels.max() >= len(classes):
                raise MissingDataError(f"{what}: the {name} split needs labels in 0.."
                                       f"{len(classes) - 1} (an unlabelled or empty split?)")
        folder.mkdir(parents=True, exist_ok=True)
        for name in SPLITS:
            split = splits[name]
            _save_atomically(_labels_path(folder, name),
                             lambda p, s=split: _save_array(p, np.asarray(s.labels, np.int64)))
            _decode_split(_images_path(folder, name, size, method), split, size, method,
                          f"{what} {name} at {size}px")
        _save_atomically(folder / "classes.json",
                         lambda p: p.write_text(json.dumps(classes)))
    return load(folder, size, method)
