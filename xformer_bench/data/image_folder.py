"""A local ImageFolder: ``DIR/train/<class>/*.{png,jpg,jpeg}`` and ``DIR/val/<class>/...``
(``DIR/validation/`` is accepted too), the layout of ImageNet's extracted training set, of
Imagenette's tarballs and of torchvision's ``ImageFolder``.

The classes are the sorted names of ``DIR/train``'s sub-folders (hidden ones skipped), label
``i`` the ``i``-th; images are every file with one of :data:`EXTENSIONS` (any case) under a
class folder, at any depth, in sorted path order.  ``DIR/val`` must use the same classes: a
folder there that is not a class of ``DIR/train`` is an error, a class with no validation
images is allowed.  Only the listing happens here; decoding is :mod:`.image_cache`'s.

:func:`fingerprint` digests a listing -- the class names and each image's path relative to
``DIR``, size and modification time (a ``stat``, no image read) -- so that a cache keyed by it
is rebuilt when an image or a class is added, removed, replaced or edited.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from xformer_bench.errors import ConfigError, MissingDataError

EXTENSIONS = (".png", ".jpg", ".jpeg")
TEST_FOLDERS = ("val", "validation")
LAYOUT = "DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg"


def is_image_folder(root: Path) -> bool:
    """Whether ``root/train`` holds class folders."""
    train = root / "train"
    return train.is_dir() and any(_class_folders(train))


def _class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def _images(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*")
                  if p.suffix.lower() in EXTENSIONS and p.is_file()
                  and not any(part.startswith(".") for part in p.relative_to(folder).parts))


Listing = tuple[list[str], dict[str, tuple[list[Path], np.ndarray]]]
"""Class names and, per split, the image files and their labels."""


def list_image_folder(root: str | Path) -> Listing:
    """``(classes, {"train": (files, labels), "test": (files, labels)})`` of the ImageFolder
    at ``root``; ``test`` is ``root/val``.  One-line errors name what is wrong."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise MissingDataError(f"data.path={root}: no such folder (expected {LAYOUT})")
    train = root / "train"
    if not train.is_dir():
        raise MissingDataError(f"data.path={root} has no train/ folder (expected {LAYOUT})")
    classes = [p.name for p in _class_folders(train)]
    if len(classes) < 2:
        raise ConfigError(f"data.path={root}: train/ has {len(classes)} class folder(s) "
                          f"{classes}; classification needs at least 2 (expected {LAYOUT})")
    test = next((root / name for name in TEST_FOLDERS if (root / name).is_dir()), None)
    if test is None:
        raise MissingDataError(f"data.path={root} has no val/ folder: its images are the test "
                               f"split (expected {LAYOUT})")
    unknown = [p.name for p in _class_folders(test) if p.name not in classes]
    if unknown:
        raise ConfigError(f"data.path={root}: {test.name}/{unknown[0]} is not a class of train/ "
                          f"({len(unknown)} such folder(s)); both must use the same class names")
    splits = {}
    for split, folder in (("train", train), ("test", test)):
        files, labels = [], []
        for label, name in enumerate(classes):
            found = _images(folder / name) if (folder / name).is_dir() else []
            if split == "train" and not found:
                raise ConfigError(f"data.path={root}: train/{name} holds no image "
                                  f"({', '.join(EXTENSIONS)})")
            files += found
            labels += [label] * len(found)
        if not files:
            raise MissingDataError(f"data.path={root}: {folder.name}/ holds no image "
                                   f"({', '.join(EXTENSIONS)}) in its class folders")
        splits[split] = (files, np.asarray(labels, dtype=np.int64))
    return classes, splits


def fingerprint(root: str | Path, listing: Listing) -> str:
    """A hex digest of what ``listing`` (of the ImageFolder at ``root``) would decode to: its
    classes and, per split, each image's relative path, label, size and modification time."""
    root = Path(root).expanduser()
    classes, splits = listing
    digest = hashlib.sha256(json.dumps(classes).encode())
    for split in sorted(splits):
        files, labels = splits[split]
        for path, label in zip(files, labels.tolist()):
            stat = path.stat()
            digest.update(f"{split}\0{path.relative_to(root).as_posix()}\0{label}\0"
                          f"{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


FINGERPRINT_DIGITS = 16
"""Hex digits of :func:`fingerprint` that name a folder's cache and a record's
``data_fingerprint``."""


def folder_fingerprint(path: str | Path) -> str:
    """The ImageFolder at ``path`` as it is now, in :data:`FINGERPRINT_DIGITS` hex digits."""
    folder = Path(path).expanduser().resolve()
    return fingerprint(folder, list_image_folder(folder))[:FINGERPRINT_DIGITS]
