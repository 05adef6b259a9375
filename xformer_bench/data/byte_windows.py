"""Byte-level language-modelling batches over uint8 arrays (memory-mapped where on disk).

Training draws ``batch_size`` random windows per step; the windows of step ``i`` depend only
on ``(seed, rank, i)``, so a resumed run sees exactly the batches an uninterrupted one would.
Evaluation covers a whole split: every byte but the first is predicted exactly once.  By
default in non-overlapping windows, each byte from the preceding bytes of its own window (0 to
``seq_len - 1`` of them); with ``eval.stride`` S as the enwik8 papers evaluate (Al-Rfou et al.
2019; Dai et al. 2019), windows of ``seq_len`` start every S bytes and each scores only its last
S targets (the first window all of its own), so every scored byte but those of the first window
has at least ``seq_len - S`` bytes of context -- at ``seq_len / S`` times the cost.
"""

from __future__ import annotations

import math

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from xformer_bench.errors import ConfigError
from xformer_bench.targets import IGNORE_INDEX


class RandomWindows(Dataset):
    """Item ``i`` is the whole batch of training step ``i``: inputs and next-byte targets."""

    def __init__(self, data: np.ndarray, seq_len: int, batch_size: int, seed: int, steps: int):
        if len(data) < seq_len + 1:
            raise ValueError(f"training split has {len(data)} bytes, fewer than seq_len+1")
        self.data, self.seq_len, self.batch_size = data, seq_len, batch_size
        self.seed, self.steps = seed, steps

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        rng = np.random.default_rng([self.seed, step])
        starts = rng.integers(0, len(self.data) - self.seq_len, size=self.batch_size)
        window = self.data[starts[:, None] + np.arange(self.seq_len + 1)]  # (B, T+1)
        window = torch.from_numpy(window.astype(np.int64))
        return window[:, :-1], window[:, 1:]


class EvalWindows(Dataset):
    """Item ``j`` is a batch of windows of ``seq_len`` starting every ``stride`` bytes (default
    ``seq_len``: non-overlapping); a target is scored once, in the first window whose last
    ``stride`` targets hold it (the first window scores all of its own).  Unscored targets --
    the overlap, the ragged tail -- are ``IGNORE_INDEX``.  ``shard``/``n_shards`` split the
    batches across ranks so that each window is evaluated exactly once."""

    def __init__(self, data: np.ndarray, seq_len: int, batch_size: int, shard: int = 0,
                 n_shards: int = 1, stride: int | None = None):
        self.data, self.seq_len, self.batch_size = data, seq_len, batch_size
        self.stride = stride or seq_len
        self.n_targets = max(len(data) - 1, 0)
        beyond_first = max(self.n_targets - seq_len, 0)
        self.n_windows = (1 + math.ceil(beyond_first / self.stride)) if self.n_targets else 0
        self.batches = list(range(math.ceil(self.n_windows / batch_size)))[shard::n_shards]

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.batches[j]
        windows = b * self.batch_size + np.arange(self.batch_size)  # (B,)
        windows = windows[windows < self.n_windows]
        starts = windows * self.stride
        pos = starts[:, None] + np.arange(self.seq_len + 1)  # (B, T+1)
        scored = pos[:, 1:] <= self.n_targets  # (B, T)
        overlap = self.seq_len - self.stride  # targets an earlier window already scored
        scored[windows > 0, :overlap] = False
        window = torch.from_numpy(self.data[np.minimum(pos, self.n_targets)].astype(np.int64))
        inputs, targets = window[:, :-1], window[:, 1:].clone()
        targets[~torch.from_numpy(scored)] = IGNORE_INDEX
        return inputs, targets


class ByteLMDataModule(L.LightningDataModule):
    task = "lm"        # trained and scored by tasks/lm.py
    unit = "bytes"     # what evaluation counts: the metric is bits per byte
    vocab_size = 256

    def __init__(self, splits: dict[str, np.ndarray], seq_len: int, batch_size: int, seed: int,
                 eval_batch_size: int | None = None, num_workers: int = 0):
        super().__init__()
        self.splits = splits
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.eval_stride: int | None = None

    def evaluate_with_stride(self, stride: int | None) -> None:
        """``eval.stride``: score only the last ``stride`` bytes of each evaluation window."""
        if stride is not None and not 1 <= stride <= self.seq_len:
            raise ConfigError(f"eval.stride={stride} must be between 1 and data.seq_len="
                              f"{self.seq_len} (null: non-overlapping windows)")
        self.eval_stride = stride

    def eval_protocol(self) -> dict[str, object]:
        """How evaluation windows were scored, for the record."""
        stride = self.eval_stride or self.seq_len
        return {"windows": "sliding" if stride < self.seq_len else "non-overlapping",
                "seq_len": self.seq_len, "stride": stride,
                "min_context": self.seq_len - stride}

    def split_bytes(self, split: str) -> int:
        return len(self.splits[split])

    def _loader(self, dataset: Dataset, sampler=None) -> DataLoader:
        return DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=self.num_workers,
                          pin_memory=torch.cuda.is_available())

    def _rank(self) -> tuple[int, int]:
        trainer = self.trainer
        return (trainer.global_rank, trainer.world_size) if trainer is not None else (0, 1)

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        rank, _ = self._rank()
        total = trainer.max_steps * trainer.accumulate_grad_batches if trainer else 1 << 30
        start = trainer.global_step * trainer.accumulate_grad_batches if trainer else 0
        dataset = RandomWindows(self.splits["train"], self.seq_len, self.batch_size,
                                seed=self.seed * 1000 + rank, steps=total)
        return self._loader(dataset, sampler=range(start, total))

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank()
        return self._loader(EvalWindows(self.splits[split], self.seq_len, self.eval_batch_size,
                                        shard=rank, n_shards=world, stride=self.eval_stride))

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")


def split_by_fraction(data: np.ndarray, fractions: tuple[float, float, float]) -> dict[str, np.ndarray]:
    """Contiguous train/val/test slices by position (views: a memmap stays a memmap)."""
    if abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"split fractions {fractions} must sum to 1")
    n_train = int(len(data) * fractions[0])
    n_val = int(len(data) * fractions[1])
    return {"train": data[:n_train], "val": data[n_train:n_train + n_val],
            "test": data[n_train + n_val:]}
