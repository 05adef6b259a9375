"""Batches of whole examples (an image, a ListOps expression, a sentence pair), for the data
that is not one long byte stream.

A split is any :class:`Examples`: it knows its length and turns a set of indices into one
batch of tensors (padding, cropping, augmenting as it sees fit).  Training step ``i`` of rank
``r`` takes the next ``batch_size`` positions of an endless walk through per-epoch
permutations -- positions ``(i * world + r) * B`` to ``+ B`` of the walk, epoch ``e``'s
permutation drawn from ``(seed, e)`` -- so every example is seen once per epoch, and a resumed
run (Lightning restarts the sampler at ``global_step``) sees exactly the batches an
uninterrupted one would.  Augmentation draws its randomness from the same ``(seed, step)``
through the ``rng`` it is handed.  Evaluation takes every example of a split exactly once, in
order, in batches of ``eval_batch_size`` dealt across ranks.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from xformer_bench.data.batch_sizes import check_batch_sizes
from xformer_bench.data.step_datamodule import RemainingSteps, StepDataModule


class Examples(Protocol):
    """One split's examples."""

    def __len__(self) -> int: ...

    def batch(self, indices: np.ndarray, rng: np.random.Generator | None) -> tuple[torch.Tensor, ...]:
        """The examples at ``indices`` as one batch; ``rng`` is given in training (draw any
        augmentation from it) and None in evaluation (no augmentation)."""
        ...


def epoch_walk(n: int, seed: int, start: int, count: int) -> np.ndarray:
    """Positions ``start .. start + count`` of the walk through per-epoch permutations of
    ``range(n)`` (epoch ``e``'s permutation from ``(seed, e)``)."""
    positions = np.arange(start, start + count)
    epochs, offsets = np.divmod(positions, n)
    out = np.empty(count, dtype=np.int64)
    for epoch in np.unique(epochs):
        permutation = np.random.default_rng([seed, int(epoch)]).permutation(n)
        here = epochs == epoch
        out[here] = permutation[offsets[here]]
    return out


class TrainingBatches(Dataset):
    """Item ``i`` is the whole batch of training step ``i`` on this rank."""

    def __init__(self, examples: Examples, batch_size: int, seed: int, steps: int,
                 rank: int = 0, world: int = 1):
        if len(examples) < 1:
            raise ValueError("the training split has no examples")
        self.examples, self.batch_size, self.seed, self.steps = examples, batch_size, seed, steps
        self.rank, self.world = rank, world

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> tuple[torch.Tensor, ...]:
        start = (step * self.world + self.rank) * self.batch_size
        indices = epoch_walk(len(self.examples), self.seed, start, self.batch_size)
        return self.examples.batch(indices, np.random.default_rng([self.seed, 7, step, self.rank]))


class EvaluationBatches(Dataset):
    """Every example of a split once, in order; batch ``j`` of ``ceil(n / B)`` goes to rank
    ``j mod world``."""

    def __init__(self, examples: Examples, batch_size: int, rank: int = 0, world: int = 1):
        self.examples, self.batch_size = examples, batch_size
        self.batches = list(range(math.ceil(len(examples) / batch_size)))[rank::world]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, j: int) -> tuple[torch.Tensor, ...]:
        start = self.batches[j] * self.batch_size
        indices = np.arange(start, min(start + self.batch_size, len(self.examples)))
        return self.examples.batch(indices, None)


class ExampleDataModule(StepDataModule):
    """A datamodule over fixed ``train`` / ``val`` / ``test`` :class:`Examples`.  Subclasses
    (or the builder) set the class attributes the task reads: ``task``, ``unit`` and the
    task's own (see :mod:`xformer_bench.data`)."""

    task = "classify"
    unit = "examples"

    def __init__(self, splits: dict[str, Examples], batch_size: int, seed: int,
                 eval_batch_size: int | None = None, num_workers: int = 0):
        check_batch_sizes(batch_size, eval_batch_size)
        super().__init__()
        self.splits = splits
        self.batch_size, self.seed = batch_size, seed
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers

    def split_size(self, split: str) -> int:
        return len(self.splits[split])

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        start, total = self._training_steps()
        dataset = TrainingBatches(self.splits["train"], self.batch_size, self.seed, total,
                                  rank=rank, world=world)
        return self._loader(dataset, sampler=RemainingSteps(start, total))

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank()
        return self._loader(EvaluationBatches(self.splits[split], self.eval_batch_size,
                                              rank=rank, world=world))
