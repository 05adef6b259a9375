"""Evaluating a model with memory (``stack=recurrent`` / ``compressive``) over a split as streams.

The split is cut into contiguous lanes, one batch row each, walked segment after segment so the
model's memory carries each lane's text; every byte but the first is scored exactly once, in
its own lane.  Three keys (``eval:`` in conf/config.yaml) set how, after Transformer-XL's
evaluation (Dai et al. 2019; the released ``run_enwik8_base.sh``: segments ``--tgt_len 80``
with ``--mem_len 2100`` after training on 512 / 512, eval.py's ``--batch_size 10`` lanes):

* ``eval.tgt_len`` -- the evaluation segment length (null: ``data.seq_len``);
* ``eval.lanes`` -- lanes per evaluation batch (per rank; null: ``data.eval_batch_size``);
* ``eval.warm`` -- each lane first reads, unscored, the text before it.  Cold lanes start
  without memory: with 64 lanes of a 55 KB split one segment in seven is scored without one
  (the authors' 10 lanes of the 5 MB enwik8 test split: one in 6000).  Warmed, lanes are
  whole segments and each starts reading :func:`warmup_bytes` before its first scored byte (at
  the split's start for the first lanes), so each scored byte gets exactly the memory a single
  stream over the whole split would give it: the result does not depend on the lanes (up to
  float rounding; for ``stack=compressive`` when c divides the segment).

The evaluation memory length is the stack's ``stack.eval_mem_len`` (null: its ``mem_len``).
Not built: the authors' ``--same_length`` (every query sees exactly mem_len keys) and
``--clamp_len 820`` (relative distances clamped).
"""

from __future__ import annotations

import math
from numbers import Integral

import numpy as np
import torch
from torch.utils.data import Dataset

from xformer_bench.errors import ConfigError
from xformer_bench.targets import IGNORE_INDEX


def lane_starts(lane_len: int, batch_size: int, shard: int) -> np.ndarray:
    """First byte of the ``batch_size`` lanes of shard ``shard`` (lanes of ``lane_len`` bytes,
    shard r holding lanes r B .. r B + B - 1): (B,)."""
    return (shard * batch_size + np.arange(batch_size)) * lane_len


def warmup_bytes(depth: int, reach: int, segment: int) -> int:
    """Bytes a lane reads before its first scored segment so that its outputs equal a single
    stream's: ``depth`` x ``reach`` rounded up to whole segments per layer.  Layer l's states of a
    segment depend on layer l - 1's over the ``reach`` positions its memory holds, which lie in
    the ceil(reach / segment) segments before; over ``depth`` layers, depth such hops.  (Reading
    only ``reach`` bytes fills the memory, but with states that themselves lacked a memory.)"""
    return depth * math.ceil(reach / segment) * segment


def check_stream_evaluation(tgt_len: object, lanes: object, warm: object, seq_len: int) -> None:
    """One :class:`ConfigError` line for an ``eval.tgt_len``, ``eval.lanes`` or ``eval.warm``
    that cannot be."""
    if tgt_len is not None and (isinstance(tgt_len, bool) or not isinstance(tgt_len, Integral)
                                or not 1 <= tgt_len <= seq_len):
        raise ConfigError(f"eval.tgt_len={tgt_len} must be an integer between 1 and "
                          f"data.seq_len={seq_len} (null: data.seq_len)")
    if lanes is not None and (isinstance(lanes, bool) or not isinstance(lanes, Integral)
                              or lanes < 1):
        raise ConfigError(f"eval.lanes={lanes} must be a positive integer "
                          "(null: data.eval_batch_size)")
    if not isinstance(warm, bool):
        raise ConfigError(f"eval.warm={warm} must be true or false")


class StreamEvalWindows(Dataset):
    """Item ``j`` is window ``j`` of each of ``batch_size`` contiguous lanes of the split (lane
    b of shard r is the ``r B + b``-th of ``B n_shards`` equal lanes), so a model with memory
    sees each lane's text in order.  Every target is scored exactly once, in its own lane; the
    rest is ``IGNORE_INDEX``.  Every batch has ``batch_size`` rows (the memory keeps).

    ``warmup`` None: cold lanes of ceil(targets / lanes) bytes.  An int W (a multiple of
    ``seq_len``): lanes of whole segments, each read from W bytes before its first target (from
    byte 0 for the first lanes), so the windows of every lane fall on the segments of a single
    stream from byte 0; the W bytes are read, not scored."""

    def __init__(self, data: np.ndarray, seq_len: int, batch_size: int, shard: int = 0,
                 n_shards: int = 1, warmup: int | None = None):
        self.data, self.seq_len = data, seq_len
        self.n_targets = max(len(data) - 1, 0)
        n_lanes = batch_size * n_shards
        lane_len = math.ceil(self.n_targets / n_lanes)
        if warmup is not None:
            lane_len = math.ceil(lane_len / seq_len) * seq_len
        firsts = lane_starts(lane_len, n_lanes, 0)  # (L,) every lane, every shard
        ends = np.minimum(firsts + lane_len, self.n_targets)  # past the last target
        reads = np.maximum(firsts - (warmup or 0), 0)  # where reading starts
        self.n_windows = math.ceil(max(int((ends - reads).max()), 0) / seq_len)  # every rank
        mine = slice(shard * batch_size, (shard + 1) * batch_size)
        self.firsts, self.ends, self.reads = firsts[mine], ends[mine], reads[mine]  # (B,) each

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, j: int) -> tuple[torch.Tensor, torch.Tensor]:
        pos = self.reads[:, None] + j * self.seq_len + np.arange(self.seq_len + 1)  # (B, T+1)
        inputs = pos[:, :-1]  # input byte p predicts byte p + 1
        scored = (inputs >= self.firsts[:, None]) & (inputs < self.ends[:, None])  # (B, T)
        window = torch.from_numpy(self.data[np.minimum(pos, self.n_targets)].astype(np.int64))
        inputs, targets = window[:, :-1], window[:, 1:].clone()
        targets[~torch.from_numpy(scored)] = IGNORE_INDEX
        return inputs, targets
