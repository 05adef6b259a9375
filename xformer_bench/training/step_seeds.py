"""Random numbers that depend on the step, not on the process's history.

Dropout, LSH rotations, random features and expert noise draw from the global generators.
Seeding them at every optimiser step from ``(seed, rank, step)`` -- and each evaluation from
``(seed, rank, step, split)`` -- makes step ``N`` draw the same numbers whether the run got
there uninterrupted or resumed from a checkpoint (the data is step-indexed already:
:mod:`xformer_bench.data.step_datamodule`), and keeps an evaluation from moving the training
stream.  Seeding costs microseconds a step.
"""

from __future__ import annotations

import hashlib

import lightning as L
import torch

SPLITS = {"train": 0, "val": 1, "test": 2}


def step_seed(seed: int, rank: int, step: int, split: str = "train") -> int:
    """A 63-bit seed from the run's seed, the rank, the step and the split."""
    digest = hashlib.blake2b(f"{seed}/{rank}/{step}/{SPLITS[split]}".encode(), digest_size=8)
    return int.from_bytes(digest.digest(), "little") >> 1


class StepSeeds(L.Callback):
    def __init__(self, seed: int):
        self.seed = seed

    def _reseed(self, trainer, split: str, step: int) -> None:
        """The CPU generator, and the GPU's when the model is on one.  Not ``torch.manual_seed``:
        on a machine whose CUDA (or XPU, MTIA) is never initialised it queues a lazy seeding
        call with its stack trace for each -- milliseconds a step, and memory that grows."""
        seed = step_seed(self.seed, trainer.global_rank, step, split)
        torch.default_generator.manual_seed(seed)
        if trainer.lightning_module.device.type == "cuda":
            torch.cuda.manual_seed(seed)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        micro = batch_idx % trainer.accumulate_grad_batches
        self._reseed(trainer, "train", trainer.global_step * trainer.accumulate_grad_batches
                     + micro)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._reseed(trainer, "val", trainer.global_step)

    def on_test_start(self, trainer, pl_module) -> None:
        self._reseed(trainer, "test", trainer.global_step)
