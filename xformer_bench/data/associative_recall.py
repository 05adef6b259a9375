"""Associative recall (Ba et al. 2016, "Using Fast Weights to Attend to the Recent Past";
single-query form of H3, Fu et al. 2023, and Zoology, Arora et al. 2023): read key-value
pairs, then a key; predict the value stored with it.

Each example is ``n_pairs`` pairs ``k_1 v_1 .. k_n v_n`` with distinct keys drawn uniformly
from ``n_keys`` key tokens (``0 .. n_keys - 1``) and values drawn uniformly, with repetition,
from ``n_values`` value tokens (``n_keys .. n_keys + n_values - 1``, an alphabet disjoint from
the keys'; ``vocab_size = n_keys + n_values``), then a query ``q``, one of the n keys chosen
uniformly, and its value ``v*``.  Protocol: next-token prediction over inputs
``k_1 v_1 .. k_n v_n q`` (``seq_len = 2 n_pairs + 1``); only the last position is scored, its
target ``v*``; every other target is ``IGNORE_INDEX``.  Bits per scored token (unit ``tokens``):
0 for perfect recall, ``log2(n_values)`` for a model that cannot find the pair.

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

TASK_KEY = 2  # this task's part of every example's seed


def recall_example(rng: np.random.Generator, n_pairs: int, n_keys: int,
                   n_values: int) -> tuple[np.ndarray, np.ndarray]:
    """One example's ``(inputs, targets)``, int64 (2 * n_pairs + 1,) each."""
    keys = rng.choice(n_keys, size=n_pairs, replace=False)
    values = n_keys + rng.integers(0, n_values, size=n_pairs)
    asked = rng.integers(0, n_pairs)
    sequence = np.empty(2 * n_pairs + 2, dtype=np.int64)
    sequence[0:2 * n_pairs:2], sequence[1:2 * n_pairs:2] = keys, values
    sequence[-2:] = keys[asked], values[asked]  # the query and its answer
    targets = np.full(2 * n_pairs + 1, IGNORE_INDEX, dtype=np.int64)
    targets[-1] = sequence[-1]
    return sequence[:-1], targets


class AssociativeRecallDataModule(ExampleDataModule):
    """Key-value sequences ending in a query (task ``lm``, bits per recalled value)."""

    task = "lm"
    unit = "tokens"

    def __init__(self, *, n_pairs: int, n_keys: int, n_values: int, sizes: dict[str, int],
                 data_seed: int, batch_size: int, seed: int, **loader):
        self.n_pairs, self.n_keys, self.n_values = n_pairs, n_keys, n_values
        self.vocab_size = n_keys + n_values

        def make(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
            return recall_example(rng, n_pairs, n_keys, n_values)

        super().__init__(seeded_splits(sizes, make, data_seed=data_seed, task_key=TASK_KEY),
                         batch_size, seed, **loader)


@DATA.register("associative_recall")
def build(*, seed: int, data_dir: str, seq_len: int, batch_size: int, n_pairs: int = 64,
          n_keys: int = 128, n_values: int = 128, n_train: int = 100_000, n_val: int = 1_000,
          n_test: int = 1_000, data_seed: int = 0, **loader) -> AssociativeRecallDataModule:
    if not 1 <= n_pairs <= n_keys or n_values < 2:
        raise ConfigError(f"data.n_pairs={n_pairs} distinct keys need 1 <= n_pairs <= "
                          f"data.n_keys={n_keys}, and data.n_values={n_values} must be >= 2")
    if seq_len != 2 * n_pairs + 1:
        raise ConfigError(f"data.seq_len={seq_len} but {n_pairs} pairs and a query are "
                          f"{2 * n_pairs + 1} input tokens: set data.seq_len={2 * n_pairs + 1}")
    return AssociativeRecallDataModule(n_pairs=n_pairs, n_keys=n_keys, n_values=n_values,
                                       sizes=split_sizes(n_train, n_val, n_test),
                                       data_seed=data_seed, batch_size=batch_size, seed=seed,
                                       **loader)
