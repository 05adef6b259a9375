"""The datamodule base of batches indexed by training step: item ``i`` of the training
dataset is the whole batch of step ``i`` (so a resumed run restarts the sampler at
``global_step`` and sees exactly the batches an uninterrupted one would), evaluation splits
are dealt across ranks by the subclass's ``_eval_loader``."""

from __future__ import annotations

from collections.abc import Iterator

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class RemainingSteps(Sampler[int]):
    """Steps ``first .. total - 1`` of a run, whose length is the whole run's ``total``: a run
    is one epoch, and Lightning, resumed mid-epoch, counts the ``first`` batches it restored
    as done, so the epoch ends exactly when these run out (a length of ``total - first`` would
    end it early and start the steps over)."""

    def __init__(self, first: int, total: int):
        self.first, self.total = first, total

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.first, self.total))

    def __len__(self) -> int:
        return self.total


class StepDataModule(L.LightningDataModule):
    num_workers: int = 0

    def _loader(self, dataset: Dataset, sampler=None) -> DataLoader:
        return DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=torch.cuda.is_available())

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def _training_steps(self) -> tuple[int, int]:
        """(first batch to draw, batches in the whole run): ``global_step`` and ``max_steps``
        in batches (each optimiser step takes ``accumulate_grad_batches``)."""
        trainer = self.trainer
        if trainer is None:
            return 0, 1 << 30
        return (trainer.global_step * trainer.accumulate_grad_batches,
                trainer.max_steps * trainer.accumulate_grad_batches)

    def _eval_loader(self, split: str) -> DataLoader:
        raise NotImplementedError

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")
