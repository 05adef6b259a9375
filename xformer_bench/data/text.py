"""Any local file as a byte-level corpus, memory-mapped and split by position."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xformer_bench.data.byte_windows import (ByteLMDataModule, smallest_corpus, split_by_fraction,
                                             split_lengths)
from xformer_bench.errors import ConfigError, MissingDataError
from xformer_bench.registry import DATA


@DATA.register("text")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, path: str | None = None,
          splits: tuple[float, float, float] = (0.9, 0.05, 0.05), **loader) -> ByteLMDataModule:
    if not path:
        raise ConfigError("data=text needs a file: add data.path=/path/to/corpus.txt")
    file = Path(path).expanduser()
    if file.is_dir():
        raise ConfigError(f"data.path={path} is a folder: point it at one text file in it")
    if not file.is_file():
        raise MissingDataError(f"data.path={path}: no such file ({file.resolve()})")
    fractions = tuple(splits)
    split_lengths(0, fractions)  # the fractions themselves, before the file's size
    size, needed = file.stat().st_size, smallest_corpus(fractions, seq_len)
    if size < needed:
        has = "is empty" if size == 0 else f"has {size} bytes, too few"
        raise ConfigError(f"data=text: {path} {has}; point data.path at a text file of at least "
                          f"{needed} bytes (one window of data.seq_len={seq_len} to train on, "
                          f"a few bytes for validation and test), or lower data.seq_len")
    corpus = np.memmap(file, dtype=np.uint8, mode="r")
    return ByteLMDataModule(split_by_fraction(corpus, fractions), seq_len, batch_size,
                            seed, **loader)
