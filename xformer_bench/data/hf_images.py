"""Image-classification datasets in the Hugging Face layout, read without decoding: an
``image`` column of ``{"bytes", "path"}`` cells (an ``Image`` feature as stored in Parquet and
Arrow) and an int ``label`` column (a ``ClassLabel``, whose names are read when recorded).

Three forms, each turned into :class:`~.image_cache.EncodedSplit` ``train`` and ``test``:

- Parquet shards in a folder, as the Hub serves them: ``train-*.parquet`` (or ``train.parquet``,
  ``*-train.parquet``, ``train/*.parquet``) and the same for the test split, named ``validation``,
  ``valid``, ``val`` or ``test``.  Read with pyarrow alone (no network, no ``datasets`` import).
- A ``DatasetDict`` saved with ``save_to_disk`` (a folder with ``dataset_dict.json``).
- The Hub: ``datasets.load_dataset(repo, config)``, saved with ``save_to_disk`` for next time.
  The hub is probed with a 3 s connection first, as ``datasets`` retries for ~20 s.  A dataset
  defined by a loading script (``frgfm/imagenette``, ``frgfm/imagewoof``), which ``datasets``
  >= 4 no longer runs, is read from the Hub's Parquet export (:data:`PARQUET_EXPORT`) instead.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from xformer_bench.data.image_cache import EncodedSplit
from xformer_bench.errors import MissingDataError

SPLIT_NAMES = {"train": ("train",), "test": ("validation", "valid", "val", "test")}
IMAGE_COLUMNS = ("image", "img")
LABEL_COLUMNS = ("label", "labels")
CHUNK = 256  # images decoded at a time
SAVED = "hf"  # the save_to_disk folder's name under a subset's folder
PARQUET_EXPORT = "refs/convert/parquet"  # the Hub's Parquet copy of a dataset: <config>/<split>/

Splits = tuple[list[str] | None, dict[str, EncodedSplit]]
"""Class names (None when the data does not record them) and the splits."""


def _column(names: list[str], wanted: tuple[str, ...], where: object) -> str:
    found = next((n for n in wanted if n in names), None)
    if found is None:
        raise MissingDataError(f"{where} has no {' or '.join(wanted)} column (columns: "
                               f"{', '.join(names)}): expected a Hugging Face image dataset")
    return found


def parquet_shards(folder: Path) -> dict[str, list[Path]] | None:
    """``{"train": files, "test": files}`` of the Parquet shards in ``folder``, or None when
    either split has none."""
    found = {}
    for split, names in SPLIT_NAMES.items():
        for name in names:
            files = sorted({*folder.glob(f"{name}-*.parquet"), *folder.glob(f"*-{name}.parquet"),
                            *folder.glob(f"{name}.parquet"), *folder.glob(f"{name}/*.parquet")})
            if files:
                found[split] = files
                break
    return found if len(found) == len(SPLIT_NAMES) else None


def _class_names(metadata: dict | None, label: str) -> list[str] | None:
    """The ``ClassLabel`` names ``datasets`` records in a Parquet schema's metadata."""
    try:
        features = json.loads(metadata[b"huggingface"])["info"]["features"]
        names = features[label].get("names")
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return list(names) if names else None


def read_parquet(shards: dict[str, list[Path]]) -> Splits:
    import pyarrow.parquet as pq

    classes, splits = None, {}
    for split, files in shards.items():
        schema = pq.read_schema(files[0])
        image = _column(schema.names, IMAGE_COLUMNS, files[0])
        label = _column(schema.names, LABEL_COLUMNS, files[0])
        classes = classes or _class_names(schema.metadata, label)
        labels = np.concatenate([pq.read_table(f, columns=[label]).column(0).to_numpy()
                                 for f in files]).astype(np.int64)

        def chunks(files=files, image=image) -> Iterator[list]:
            for file in files:
                for batch in pq.ParquetFile(file).iter_batches(batch_size=CHUNK, columns=[image]):
                    yield batch.column(0).to_pylist()

        splits[split] = EncodedSplit(labels, chunks)
    return classes, splits


def is_saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file()


def _from_dataset_dict(dataset_dict, where: object) -> Splits:
    import datasets

    classes, splits = None, {}
    for split, names in SPLIT_NAMES.items():
        name = next((n for n in names if n in dataset_dict), None)
        if name is None:
            raise MissingDataError(f"{where} has no split named {' or '.join(names)} (splits: "
                                   f"{', '.join(dataset_dict)})")
        ds = dataset_dict[name]
        image = _column(ds.column_names, IMAGE_COLUMNS, where)
        label = _column(ds.column_names, LABEL_COLUMNS, where)
        feature = ds.features[label]
        classes = classes or (list(feature.names) if hasattr(feature, "names") else None)
        ds = ds.cast_column(image, datasets.Image(decode=False)).select_columns([image, label])
        labels = np.asarray(ds.with_format("numpy")[label], dtype=np.int64)

        def chunks(ds=ds, image=image) -> Iterator[list]:
            for batch in ds.iter(batch_size=CHUNK):
                yield batch[image]

        splits[split] = EncodedSplit(labels, chunks)
    return classes, splits


def read_saved(folder: Path) -> Splits:
    import datasets

    return _from_dataset_dict(datasets.load_from_disk(str(folder)), folder)


def download(repo: str, config: str | None, destination: Path) -> Splits:
    """``repo`` (``config``) from the Hub, saved to ``destination`` with ``save_to_disk``."""
    socket.create_connection(("huggingface.co", 443), timeout=3).close()
    import datasets  # imported here: slow, and only needed when nothing is local

    try:
        dataset_dict = datasets.load_dataset(repo, config)
    except RuntimeError as error:  # a loading script (frgfm's): datasets >= 4 runs none, so
        if "script" not in str(error):  # read the Parquet export the Hub made of it instead
            raise
        dataset_dict = datasets.load_dataset(repo, data_dir=config, revision=PARQUET_EXPORT)
    partial = destination.with_name(f".{destination.name}.{os.getpid()}.part")
    try:
        dataset_dict.save_to_disk(str(partial))
        if destination.exists():  # another rank finished first
            shutil.rmtree(partial)
        else:
            os.replace(partial, destination)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return read_saved(destination)
