"""CIFAR-10 (Krizhevsky 2009, "Learning Multiple Layers of Features from Tiny Images"): 60,000
32 x 32 colour images in 10 classes, 50,000 for training and 10,000 for test.  This module
finds and decodes the files, splits them, and registers ``data=cifar10``, the pixel language
model of the Sparse Transformer; ``data=cifar10_classify`` (:mod:`.cifar10_classify`)
classifies the same images.

Files.  Under ``<data_dir>/cifar10/`` (or ``<data_dir>/``) the official python tarball
``cifar-10-python.tar.gz`` or its extracted folder ``cifar-10-batches-py/`` (``data_batch_1``
.. ``data_batch_5``, ``test_batch``); when neither is there the tarball is downloaded from
:data:`URL`, and offline a missing tarball is one :class:`MissingDataError` line naming it and
its folder.  The tarball's members are read in memory (nothing is extracted, and only the six
batch files are read); each batch is unpickled with :mod:`.safe_pickle`, so a tampered file
cannot run code.  A batch is a dict with ``b"data"``, uint8 (n, 3072) rows of 1024 red, 1024
green then 1024 blue bytes (each plane row-major), and ``b"labels"``, n ints in 0..9.

Cache.  Decoded once into ``<data_dir>/cifar10/cifar10_{train,test}_uint8.npy`` (N, 32, 32, 3)
uint8, channels last, and ``cifar10_{train,test}_labels.npy`` (N,) int64, each written under a
temporary name then renamed; later runs memory-map them and never open the tarball.

Splits.  The training images in the official order (``data_batch_1`` .. ``_5``); the last
``val_size`` of them are the validation split, the rest training; test is ``test_batch``.  The
Sparse Transformer trained on 48,000 and validated on 2,000 (Child et al. 2019, section 7.1):
``val_size: 2000``.

``data=cifar10``: each image one sequence of its 3072 sub-pixel bytes in raster order,
channels interleaved, scored in bits per dimension (:mod:`.pixels`).  ``resolution`` box-
downsamples the images first (e.g. 8: 8 x 8 x 3 = 192 sub-pixels, for quick CPU runs); then
``seq_len`` must be ``resolution**2 * 3``.
"""

from __future__ import annotations

import os
import tarfile
import zlib
from pathlib import Path

import numpy as np

from xformer_bench.data import safe_pickle
from xformer_bench.data.download import download, offline
from xformer_bench.data.pixels import PixelLMDataModule, downsample
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA

URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
ARCHIVE = "cifar-10-python.tar.gz"
FOLDER = "cifar-10-batches-py"
BATCHES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
SIDE, CHANNELS, NUM_CLASSES = 32, 3, 10
ROW_BYTES = SIDE * SIDE * CHANNELS  # 3072
MAX_BATCH_BYTES = 64 << 20  # an original batch is ~31 MB
DOWNSAMPLE_CHUNK = 4096  # images box-filtered at a time (bounds the float32 copy)


def _not_a_batch(where: str, why: str) -> MissingDataError:
    return MissingDataError(f"{where} is not a CIFAR-10 python batch ({why}): place the original "
                            f"{ARCHIVE} ({URL}) instead")


def decode_batch(raw: bytes, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch -> images (n, 32, 32, 3) uint8 and labels (n,) int64."""
    try:
        batch = safe_pickle.loads(raw)
    except Exception as error:  # noqa: BLE001 -- any unreadable pickle is the same user error
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:160]
        raise _not_a_batch(where, reason) from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        keys = sorted(map(repr, batch)) if isinstance(batch, dict) else type(batch).__name__
        raise _not_a_batch(where, f"expected a dict with b'data' and b'labels', got {keys}")
    data, labels = batch[b"data"], batch[b"labels"]
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2
            and data.shape[1] == ROW_BYTES):
        shape = getattr(data, "shape", None)
        raise _not_a_batch(where, f"b'data' must be uint8 (n, {ROW_BYTES}), got "
                                  f"{getattr(data, 'dtype', type(data).__name__)} {shape}")
    try:
        labels = np.asarray(labels, dtype=np.int64)
    except (TypeError, ValueError):
        raise _not_a_batch(where, "b'labels' must be a list of ints") from None
    in_range = labels.size == 0 or 0 <= labels.min() <= labels.max() < NUM_CLASSES
    if labels.shape != (len(data),) or not in_range:
        raise _not_a_batch(where, f"b'labels' must be {len(data)} ints in 0..{NUM_CLASSES - 1}")
    planes = data.reshape(len(data), CHANNELS, SIDE, SIDE)  # channel-planar rows
    return np.ascontiguousarray(planes.transpose(0, 2, 3, 1)), labels


def _from_folder(folder: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    decoded = {}
    for name in (n for names in BATCHES.values() for n in names):
        path = folder / name
        if not path.is_file():
            raise MissingDataError(f"{path} is missing: place the complete {FOLDER}/ folder or "
                                   f"the original {ARCHIVE} ({URL}) in {folder.parent}")
        decoded[name] = decode_batch(path.read_bytes(), str(path))
    return decoded


def _from_archive(archive: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Decode the six batches straight from the tarball's members; every other member (the
    tarball also holds ``batches.meta`` and ``readme.html``) is skipped unread."""
    expected = {f"{FOLDER}/{n}": n for names in BATCHES.values() for n in names}
    decoded = {}
    try:
        with tarfile.open(archive, "r:*") as tar:
            for member in tar:
                name = expected.get(member.name.removeprefix("./"))
                if name is None:
                    continue
                if name in decoded or not member.isfile() or member.size > MAX_BATCH_BYTES:
                    raise _not_a_batch(f"{archive}:{member.name}", "a duplicate, a link or too "
                                                                   "large")
                decoded[name] = decode_batch(tar.extractfile(member).read(),
                                             f"{archive}:{member.name}")
    except (tarfile.TarError, EOFError, OSError, zlib.error) as error:
        raise MissingDataError(f"{archive} is not a readable tar.gz ({type(error).__name__}): "
                               f"delete it and place the original {ARCHIVE} ({URL})") from None
    missing = [f for f, n in expected.items() if n not in decoded]
    if missing:
        raise MissingDataError(f"{archive} lacks {', '.join(missing)}: delete it and place the "
                               f"original {ARCHIVE} ({URL})")
    return decoded


def _source(data_dir: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The decoded batches from the folder or tarball found, else from a downloaded tarball."""
    home = data_dir / "cifar10"
    for folder in (home, data_dir):
        if (folder / FOLDER).is_dir():
            return _from_folder(folder / FOLDER)
        if (folder / ARCHIVE).is_file():
            return _from_archive(folder / ARCHIVE)
    hint = (f"CIFAR-10 not found: place {ARCHIVE} ({URL}) as {(home / ARCHIVE).resolve()} "
            f"(set paths.data_dir=... or $XBENCH_DATA_DIR)")
    if offline():
        raise MissingDataError(hint + "; offline mode is on, so nothing was downloaded")
    try:
        archive = download(URL, home / ARCHIVE)
    except Exception as error:  # noqa: BLE001 -- every failure is the same hint
        reason = f"{type(error).__name__}: {error}".splitlines()[0][:120]
        raise MissingDataError(f"{hint}; download failed ({reason})") from None
    return _from_archive(archive)


def _cache_paths(data_dir: Path, split: str) -> tuple[Path, Path]:
    home = data_dir / "cifar10"
    return home / f"cifar10_{split}_uint8.npy", home / f"cifar10_{split}_labels.npy"


def _save_atomically(path: Path, array: np.ndarray) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.part")  # one per process: ranks race
    with open(partial, "wb") as out:
        np.save(out, array)
    os.replace(partial, path)


def _load_cache(data_dir: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    images_path, labels_path = _cache_paths(data_dir, split)
    images, labels = np.load(images_path, mmap_mode="r"), np.load(labels_path, mmap_mode="r")
    if (images.dtype != np.uint8 or images.shape[1:] != (SIDE, SIDE, CHANNELS)
            or labels.shape != (len(images),)):
        raise MissingDataError(f"{images_path} or {labels_path} is damaged: delete both and "
                               "run again to decode the CIFAR-10 batches anew")
    return images, labels


def load(data_dir: str | Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The official ``train`` (50,000) and ``test`` (10,000) images (N, 32, 32, 3) uint8 and
    labels (N,) int64, memory-mapped from the cache (decoded into it first if need be)."""
    data_dir = Path(data_dir)
    if not all(p.is_file() for split in BATCHES for p in _cache_paths(data_dir, split)):
        decoded = _source(data_dir)
        (data_dir / "cifar10").mkdir(parents=True, exist_ok=True)
        for split, names in BATCHES.items():
            images_path, labels_path = _cache_paths(data_dir, split)
            _save_atomically(labels_path, np.concatenate([decoded[n][1] for n in names]))
            _save_atomically(images_path, np.concatenate([decoded[n][0] for n in names]))
        del decoded
    return {split: _load_cache(data_dir, split) for split in BATCHES}


def standard_splits(data_dir: str | Path,
                    val_size: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``train`` / ``val`` / ``test`` (images, labels): the last ``val_size`` official training
    images are ``val``, the rest ``train``; ``test`` is the test batch."""
    data = load(data_dir)
    images, labels = data["train"]
    if not 1 <= val_size < len(images):
        raise ConfigError(f"data.val_size={val_size} must be between 1 and {len(images) - 1} "
                          f"(the {len(images)} training images hold out the last val_size)")
    cut = len(images) - val_size
    return {"train": (images[:cut], labels[:cut]), "val": (images[cut:], labels[cut:]),
            "test": data["test"]}


def at_resolution(images: np.ndarray, size: int) -> np.ndarray:
    """``images`` box-downsampled to ``size`` x ``size`` (:func:`.pixels.downsample`), a few
    thousand at a time; the memory map itself at full size."""
    if size == images.shape[1]:
        return images
    chunks = [downsample(np.asarray(images[i:i + DOWNSAMPLE_CHUNK]), size)
              for i in range(0, len(images), DOWNSAMPLE_CHUNK)]
    return np.concatenate(chunks)


def _check_resolution(resolution, seq_len) -> None:
    if not (isinstance(resolution, int) and 1 <= resolution <= SIDE and SIDE % resolution == 0):
        raise ConfigError(f"data.resolution={resolution} must divide {SIDE} (32, 16, 8, 4, 2 or 1)")
    dims = resolution * resolution * CHANNELS
    if seq_len != dims:
        raise ConfigError(f"data.seq_len={seq_len} but each {resolution}x{resolution}x{CHANNELS} "
                          f"image is {dims} sub-pixels: set data.seq_len={dims}")


@DATA.register("cifar10")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, resolution: int = SIDE,
          val_size: int = 2000, **loader) -> PixelLMDataModule:
    _check_resolution(resolution, seq_len)  # before any file is touched
    images = {split: at_resolution(x, resolution)
              for split, (x, _) in standard_splits(data_dir, val_size).items()}
    return PixelLMDataModule(images, batch_size, seed, seq_len=seq_len, **loader)
