"""Copy: a quick long-range check for language models (the copying memory task of Hochreiter &
Schmidhuber 1997 and Arjovsky et al. 2016, here without a blank gap: the second half
repeats the first, as in the copy tasks of Graves et al. 2014 and Jelassi et al. 2024,
"Repeat After Me").

Each example is ``length`` symbols drawn uniformly from ``n_symbols``, a separator, then the
same symbols again: ``x_1 .. x_n SEP x_1 .. x_n`` (2n + 1 tokens; symbols are tokens
``0 .. n_symbols - 1``, ``SEP = n_symbols``, ``vocab_size = n_symbols + 1``).  Protocol: next-
token prediction over inputs ``x_1 .. x_n SEP x_1 .. x_{n-1}`` (``seq_len = 2n``); only the copy
is scored -- the targets of the last n positions, ``x_1 .. x_n``, each predicted from the whole
first half and the copy so far; every other target is ``IGNORE_INDEX`` (the first half is
random, nothing there can be learnt).  Bits per scored token (unit ``tokens``): 0 for a perfect
copier, ``log2(n_symbols)`` for a model that cannot look back n positions.

Examples are generated from ``(data_seed, split, index)`` (:mod:`.seeded_examples`): no
storage, the same data for every training seed, splits from disjoint streams.
"""

from __future__ import annotations

import numpy as np

from xformer_bench.data.example_batches import ExampleDataModule
from xformer_bench.data.seeded_examples import seeded_splits, split_sizes
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DATA
from xformer_bench.targets import IGNORE_INDEX

TASK_KEY = 1  # this task's part of every example's seed


def copy_example(rng: np.random.Generator, length: int, n_symbols: int) -> tuple[np.ndarray, np.ndarray]:
    """One example's ``(inputs, targets)``, int64 (2 * length,) each."""
    symbols = rng.integers(0, n_symbols, size=length)
    sequence = np.concatenate([symbols, [n_symbols], symbols])  # x SEP x
    targets = sequence[1:].copy()
    targets[:length] = IGNORE_INDEX  # the first half (and SEP) is not scored
    return sequence[:-1], targets


class CopyDataModule(ExampleDataModule):
    """Copy sequences (task ``lm``, bits per copied token)."""

    task = "lm"
    unit = "tokens"

    def __init__(self, *, length: int, n_symbols: int, sizes: dict[str, int], data_seed: int,
                 batch_size: int, seed: int, **loader):
        self.length, self.n_symbols = length, n_symbols
        self.separator_id = n_symbols
        self.vocab_size = n_symbols + 1

        def make(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
            return copy_example(rng, length, n_symbols)

        super().__init__(seeded_splits(sizes, make, data_seed=data_seed, task_key=TASK_KEY),
                         batch_size, seed, **loader)


@DATA.register("copy")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, length: int = 128,
          n_symbols: int = 16, n_train: int = 100_000, n_val: int = 1_000, n_test: int = 1_000,
          data_seed: int = 0, **loader) -> CopyDataModule:
    if length < 1 or n_symbols < 2:
        raise ConfigError(f"data.length={length} must be >= 1 and data.n_symbols={n_symbols} >= 2")
    if seq_len != 2 * length:
        raise ConfigError(f"data.seq_len={seq_len} but a copy of data.length={length} symbols "
                          f"is {2 * length} input tokens: set data.seq_len={2 * length}")
    return CopyDataModule(length=length, n_symbols=n_symbols, data_seed=data_seed,
                          sizes=split_sizes(n_train, n_val, n_test),
                          batch_size=batch_size, seed=seed, **loader)
