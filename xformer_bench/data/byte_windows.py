"""Byte-level language-modelling batches over uint8 arrays (memory-mapped where on disk).

Training draws ``batch_size`` random windows per step; the windows of step ``i`` depend only
on ``(seed, rank, i)``, so a resumed run sees exactly the batches an uninterrupted one would.
Evaluation covers a whole split: every byte but the first is predicted exactly once.  By
default in non-overlapping windows, each byte from the preceding bytes of its own window (0 to
``seq_len - 1`` of them); with ``eval.stride`` S as the enwik8 papers evaluate (Al-Rfou et al.
2019; Dai et al. 2019), windows of ``seq_len`` start every S bytes and each scores only its last
S targets (the first window all of its own), so every scored byte but those of the first window
has at least ``seq_len - S`` bytes of context -- at ``seq_len / S`` times the cost.

Streams (``use_streams``, for a model that carries memory from one batch to the next:
Transformer-XL's segment recurrence, Dai et al. 2019) replace both.  Training cuts the split
into ``batch_size`` contiguous lanes and step ``i`` gives each row the next segment of its lane
(:class:`StreamWindows`), so consecutive steps continue each row's text; evaluation walks the
split as contiguous lanes, segment after segment, still scoring every byte but the first exactly
once (:mod:`xformer_bench.data.eval_streams`: ``eval.tgt_len``, ``eval.lanes``, ``eval.warm``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from numbers import Real

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from xformer_bench.data.batch_sizes import check_batch_sizes
from xformer_bench.data.eval_streams import (StreamEvalWindows, check_stream_evaluation,
                                             lane_starts, warmup_bytes)
from xformer_bench.data.step_datamodule import RemainingSteps, StepDataModule
from xformer_bench.errors import ConfigError
from xformer_bench.targets import IGNORE_INDEX

MIN_EVAL_BYTES = 2
"""An evaluation split scores at least one byte: it needs that byte and the one before it."""


def split_shortfall(lengths: Mapping[str, int], seq_len: int) -> str | None:
    """Why splits of these lengths (bytes) cannot give one training window of ``seq_len``
    inputs and targets (``seq_len + 1`` bytes) or one evaluation target; None when they can."""
    for split, n in lengths.items():
        need = seq_len + 1 if split == "train" else MIN_EVAL_BYTES
        if n < need:
            what = ("one window of data.seq_len + 1" if split == "train"
                    else "one byte to predict and one before it")
            return f"the {split} split has {n} bytes, fewer than the {need} of {what}"
    return None


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


class StreamWindows(Dataset):
    """Item ``i`` is the batch of training step ``i`` as contiguous streams: the split is cut
    into ``batch_size`` lanes (``n_shards`` times as many, each shard taking its own) of K whole
    segments of ``seq_len``, and row b of step i is segment ``(i + phase) mod K`` of lane b --
    the text right after row b's segment of step i - 1.  ``phase`` and a shift of every lane
    within its slack depend on ``seed``; item i depends only on ``(seed, i)``, so a resumed run
    sees the batches an uninterrupted one would.  After K steps each lane starts over (the
    memory then holds the lane's end: one seam per pass)."""

    def __init__(self, data: np.ndarray, seq_len: int, batch_size: int, seed: int, steps: int,
                 shard: int = 0, n_shards: int = 1):
        lane_len = max(len(data) - 1, 0) // (batch_size * n_shards)  # targets per lane
        self.segments = lane_len // seq_len  # K
        if self.segments < 1:
            raise ConfigError(f"the training split's {len(data)} bytes do not make "
                              f"{batch_size * n_shards} streams of data.seq_len={seq_len}: lower "
                              "data.batch_size or data.seq_len")
        self.data, self.seq_len, self.steps = data, seq_len, steps
        rng = np.random.default_rng([seed, 1])
        self.phase = int(rng.integers(0, self.segments))
        shift = rng.integers(0, lane_len - self.segments * seq_len + 1)
        self.starts = lane_starts(lane_len, batch_size, shard) + shift  # (B,)

    def __len__(self) -> int:
        return self.steps

    def __getitem__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        segment = (step + self.phase) % self.segments
        pos = self.starts[:, None] + segment * self.seq_len + np.arange(self.seq_len + 1)  # (B, T+1)
        window = torch.from_numpy(self.data[pos].astype(np.int64))
        return window[:, :-1], window[:, 1:]


class ByteLMDataModule(StepDataModule):
    task = "lm"        # trained and scored by tasks/lm.py
    unit = "bytes"     # what evaluation counts: the metric is bits per byte
    vocab_size = 256

    def __init__(self, splits: dict[str, np.ndarray], seq_len: int, batch_size: int, seed: int,
                 eval_batch_size: int | None = None, num_workers: int = 0):
        check_batch_sizes(batch_size, eval_batch_size)
        shortfall = split_shortfall({split: len(data) for split, data in splits.items()}, seq_len)
        if shortfall:
            raise ConfigError(f"{shortfall}: use more data or lower data.seq_len={seq_len}")
        super().__init__()
        self.splits = splits
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.eval_stride: int | None = None
        self.stream_memory: int | None = None  # set by use_streams: the model's memory length
        self.segment, self.lanes, self.warmup = seq_len, self.eval_batch_size, None  # streams

    def evaluate_streams(self, tgt_len: int | None = None, lanes: int | None = None,
                         warm: bool = False, depth: int = 0, reach: int = 0) -> None:
        """``eval.tgt_len`` / ``eval.lanes`` / ``eval.warm`` (checked for every run, used once
        :meth:`use_streams` is called); ``depth`` layers whose evaluation memory holds ``reach``
        earlier positions each set the warm-up (:func:`warmup_bytes`)."""
        check_stream_evaluation(tgt_len, lanes, warm, self.seq_len)
        self.segment, self.lanes = tgt_len or self.seq_len, lanes or self.eval_batch_size
        self.warmup = warmup_bytes(depth, reach, self.segment) if warm else None

    def use_streams(self, memory: int) -> None:
        """Train and evaluate in contiguous streams per batch row, for a model that carries
        ``memory`` states of each row from one batch to the next (``stack=recurrent``)."""
        if self.eval_stride is not None:
            raise ConfigError(f"eval.stride={self.eval_stride} slides overlapping windows, but a "
                              "model with memory (stack=recurrent) evaluates each split as "
                              "streams: remove eval.stride")
        self.stream_memory = memory

    def evaluate_with_stride(self, stride: int | None) -> None:
        """``eval.stride``: score only the last ``stride`` bytes of each evaluation window."""
        if stride is not None and not 1 <= stride <= self.seq_len:
            raise ConfigError(f"eval.stride={stride} must be between 1 and data.seq_len="
                              f"{self.seq_len} (null: non-overlapping windows)")
        self.eval_stride = stride

    def eval_protocol(self) -> dict[str, object]:
        """How evaluation windows were scored, for the record."""
        if self.stream_memory is not None:  # warmup: bytes read unscored before each lane
            return {"windows": "streams", "seq_len": self.segment, "stride": self.segment,
                    "min_context": 0, "lanes": self.lanes, "memory": self.stream_memory,
                    "warmup": self.warmup}
        stride = self.eval_stride or self.seq_len
        return {"windows": "sliding" if stride < self.seq_len else "non-overlapping",
                "seq_len": self.seq_len, "stride": stride,
                "min_context": self.seq_len - stride}

    def split_bytes(self, split: str) -> int:
        return len(self.splits[split])

    def train_dataloader(self) -> DataLoader:
        rank, world = self._rank()
        start, total = self._training_steps()
        if self.stream_memory is not None:
            dataset = StreamWindows(self.splits["train"], self.seq_len, self.batch_size,
                                    seed=self.seed, steps=total, shard=rank, n_shards=world)
        else:
            dataset = RandomWindows(self.splits["train"], self.seq_len, self.batch_size,
                                    seed=self.seed * 1000 + rank, steps=total)
        return self._loader(dataset, sampler=RemainingSteps(start, total))

    def _eval_loader(self, split: str) -> DataLoader:
        rank, world = self._rank()
        data = self.splits[split]
        if self.stream_memory is not None:
            return self._loader(StreamEvalWindows(data, self.segment, self.lanes, shard=rank,
                                                  n_shards=world, warmup=self.warmup))
        return self._loader(EvalWindows(data, self.seq_len, self.eval_batch_size, shard=rank,
                                        n_shards=world, stride=self.eval_stride))


def split_lengths(n_bytes: int, fractions: tuple[float, float, float]) -> dict[str, int]:
    """Bytes of the train / val / test slices of ``n_bytes`` cut by ``fractions``
    (``data.splits``: three positive fractions summing to 1)."""
    fractions = tuple(fractions)
    valid = (len(fractions) == 3 and all(isinstance(f, Real) and f > 0 for f in fractions)
             and abs(sum(fractions) - 1.0) <= 1e-9)
    if not valid:
        raise ConfigError(f"data.splits={list(fractions)} must be three positive fractions "
                          "(train, val, test) summing to 1, e.g. [0.9, 0.05, 0.05]")
    n_train, n_val = int(n_bytes * fractions[0]), int(n_bytes * fractions[1])
    return {"train": n_train, "val": n_val, "test": n_bytes - n_train - n_val}


def smallest_corpus(fractions: tuple[float, float, float], seq_len: int) -> int:
    """The fewest bytes that, cut by ``fractions``, pass :func:`split_shortfall`."""
    n_bytes = math.floor(max((seq_len + 1) / fractions[0], MIN_EVAL_BYTES / min(fractions[1:])))
    while split_shortfall(split_lengths(n_bytes, fractions), seq_len):
        n_bytes += 1  # rounding: a few more at most
    return n_bytes


def split_by_fraction(data: np.ndarray, fractions: tuple[float, float, float]) -> dict[str, np.ndarray]:
    """Contiguous train/val/test slices by position (views: a memmap stays a memmap)."""
    lengths = split_lengths(len(data), fractions)
    n_train, n_val = lengths["train"], lengths["val"]
    return {"train": data[:n_train], "val": data[n_train:n_train + n_val],
            "test": data[n_train + n_val:]}
