"""Examples generated on demand, each from its own random stream: example ``i`` of split ``s``
is a pure function of ``(data_seed, task, s, i)``, so a synthetic data set needs no storage,
is the same for every training seed and every process, and its splits are drawn from
disjoint streams (different split keys)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from xformer_bench.errors import ConfigError

SPLIT_KEYS = {"train": 0, "val": 1, "test": 2}


class SeededExamples:
    """:class:`~xformer_bench.data.example_batches.Examples` of ``n`` generated LM sequences:
    ``make(rng)`` returns one example's ``(inputs, targets)`` int64 (T,) from the generator
    :meth:`rng` gives for its index; batches stack them to (B, T)."""

    def __init__(self, n: int, make: Callable[[np.random.Generator], tuple[np.ndarray, np.ndarray]],
                 *, data_seed: int, task_key: int, split: str):
        self.n, self.make = n, make
        self.entropy = (data_seed, task_key, SPLIT_KEYS[split])

    def __len__(self) -> int:
        return self.n

    def rng(self, index: int) -> np.random.Generator:
        """The random stream of example ``index`` of this split."""
        return np.random.default_rng([*self.entropy, int(index)])

    def batch(self, indices: np.ndarray, rng=None) -> tuple[torch.Tensor, torch.Tensor]:
        pairs = [self.make(self.rng(i)) for i in indices]  # no augmentation, rng unused
        inputs = np.stack([p[0] for p in pairs]).astype(np.int64)
        targets = np.stack([p[1] for p in pairs]).astype(np.int64)
        return torch.from_numpy(inputs), torch.from_numpy(targets)


def split_sizes(n_train: int, n_val: int, n_test: int) -> dict[str, int]:
    """``{split: examples}``; a one-line ConfigError for an empty split."""
    sizes = {"train": n_train, "val": n_val, "test": n_test}
    for split, n in sizes.items():
        if n < 1:
            key = {"train": "n_train", "val": "n_val", "test": "n_test"}[split]
            raise ConfigError(f"data.{key}={n}: every split needs at least one example")
    return sizes


def seeded_splits(sizes: dict[str, int], make: Callable, *, data_seed: int,
                  task_key: int) -> dict[str, SeededExamples]:
    """One :class:`SeededExamples` per split, of the sizes asked for."""
    return {split: SeededExamples(n, make, data_seed=data_seed, task_key=task_key, split=split)
            for split, n in sizes.items()}
