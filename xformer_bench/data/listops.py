"""ListOps (Nangia & Bowman 2018), the Long Range Arena version (Tay et al. 2021): classify a
nested expression such as ``[MAX 4 3 [MIN 2 3 ] 1 0 [MED 1 5 8 9 2 ] ]`` into its value 0-9
(10 classes); the expressions and their distribution are :mod:`.listops_generator`'s.

Protocol: an encoder reads the expression's tokens (vocabulary 16: padding 0, the ten digits,
the four operators, ``]``), padded at the end to ``seq_len = max_length`` with ``pad_id = 0``;
accuracy over whole validation / test splits; no augmentation.

The data set is generated once, offline, from ``data_seed`` alone (not the training seed, so
every training seed sees the same data) and cached as ``.npy`` files under
``<data_dir>/listops/<key>/``, the key naming every generator parameter; a build finding them
loads (memory-maps) them instead of generating.  Splits are drawn from separate random streams
-- test, then validation, then training -- and no expression occurs in two of them (or twice in
one): the test set depends only on ``data_seed``, the length window, depth, arguments and
``n_test``.

Simplification: LRA's data set is 96,000 / 2,000 / 2,000 expressions of 500 < length < 2000
tokens (classified at length 2000); the defaults here are 20,000 / 2,000 / 2,000 of
128 < length < 512, which trains on a CPU.  LRA's setting:
``data=listops data.max_length=2000 data.min_length=500 data.n_train=96000`` (about a minute
to generate).
"""

from __future__ import annotations

import os
import random
import shutil
import uuid
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from xformer_bench.data import listops_generator
from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.data.listops_generator import NUM_CLASSES, PAD_ID, VOCAB_SIZE
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DATA

GENERATOR_VERSION = 1
"""Part of the cache key: raise it when the generator's output for given parameters changes."""
SPLITS = ("test", "val", "train")
"""Generation order: each split excludes the expressions of those before it."""


class ListOpsExamples:
    """:class:`~xformer_bench.data.example_batches.Examples` over tokens (N, max_length) uint8
    and values (N,): batches ``(tokens int64 (B, max_length), labels int64 (B,))``."""

    def __init__(self, tokens: np.ndarray, labels: np.ndarray):
        if tokens.ndim != 2 or len(tokens) != len(labels):
            raise ValueError(f"tokens (N, L) and labels (N,) expected, got {tokens.shape} and {labels.shape}")
        self.tokens, self.labels = tokens, labels

    def __len__(self) -> int:
        return len(self.tokens)

    def batch(self, indices: np.ndarray, rng=None) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = np.asarray(self.tokens[indices], dtype=np.int64)  # no augmentation, rng unused
        return torch.from_numpy(tokens), torch.from_numpy(np.asarray(self.labels[indices], dtype=np.int64))


class ListOpsDataModule(ExampleDataModule):
    """ListOps expressions with their values (task ``classify``, tokens)."""

    task = "classify"
    unit = "examples"
    input_kind = "tokens"
    num_classes = NUM_CLASSES
    vocab_size = VOCAB_SIZE
    pad_id = PAD_ID


def cache_key(*, data_seed: int, min_length: int, max_length: int, max_depth: int,
              max_args: int, n_train: int, n_val: int, n_test: int) -> str:
    """The folder name of one generated data set: every parameter of the generator."""
    return (f"v{GENERATOR_VERSION}-seed{data_seed}-length{min_length}-{max_length}-"
            f"depth{max_depth}-args{max_args}-n{n_train}-{n_val}-{n_test}")


def _generate(folder: Path, sizes: dict[str, int], data_seed: int, **params: int) -> None:
    """Generate every split into a fresh folder, then rename it to ``folder`` (atomic: a
    reader sees the whole data set or none; a concurrent writer that finished first wins)."""
    partial = folder.with_name(f".{folder.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial")
    partial.mkdir(parents=True)
    try:
        seen: set[bytes] = set()
        with tqdm(total=sum(sizes.values()), desc=f"generating ListOps ({folder.name})",
                  unit="expr") as bar:
            for split in SPLITS:
                stream = random.Random(f"listops/{data_seed}/{split}")  # str seeds: stable
                tokens, labels = listops_generator.generate(sizes[split], stream, seen=seen,
                                                            progress=bar.update, **params)
                np.save(partial / f"{split}_tokens.npy", tokens)
                np.save(partial / f"{split}_labels.npy", labels)
        try:
            os.rename(partial, folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        if partial.exists():
            shutil.rmtree(partial, ignore_errors=True)


def load_or_generate(data_dir: str | Path, *, data_seed: int, min_length: int, max_length: int,
                     max_depth: int, max_args: int, n_train: int, n_val: int,
                     n_test: int) -> dict[str, ListOpsExamples]:
    """The three splits, from the cache under ``<data_dir>/listops/`` or generated into it."""
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    params = dict(min_length=min_length, max_length=max_length, max_depth=max_depth,
                  max_args=max_args)
    folder = Path(data_dir) / "listops" / cache_key(data_seed=data_seed, **params, n_train=n_train,
                                                      n_val=n_val, n_test=n_test)
    if not folder.is_dir():
        try:
            _generate(folder, sizes, data_seed, **params)
        except ValueError as error:
            raise ConfigError(f"data=listops: {error}") from None
    return {split: ListOpsExamples(np.load(folder / f"{split}_tokens.npy", mmap_mode="r"),
                                   np.load(folder / f"{split}_labels.npy", mmap_mode="r"))
            for split in ("train", "val", "test")}


@DATA.register("listops")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, max_length: int = 512,
          min_length: int = 128, max_depth: int = 10, max_args: int = 10, n_train: int = 20_000,
          n_val: int = 2_000, n_test: int = 2_000, data_seed: int = 0,
          **loader) -> ListOpsDataModule:
    if seq_len != max_length:
        raise ConfigError(f"data.seq_len={seq_len} but ListOps pads every expression to "
                          f"data.max_length={max_length}: set data.seq_len={max_length} "
                          "(or data.max_length to the length you want)")
    for key, n in (("n_train", n_train), ("n_val", n_val), ("n_test", n_test)):
        if n < 1:
            raise ConfigError(f"data.{key}={n}: every split needs at least one expression")
    splits = load_or_generate(data_dir, data_seed=data_seed, min_length=min_length,
                              max_length=max_length, max_depth=max_depth, max_args=max_args,
                              n_train=n_train, n_val=n_val, n_test=n_test)
    return ListOpsDataModule(splits, batch_size, seed, **loader)
