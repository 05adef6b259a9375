"""Batches of whole examples: each example once per epoch, resumable by step, eval covers a
split exactly once across ranks."""

from __future__ import annotations

import numpy as np
import torch

from xformer_bench.data.example_batches import EvaluationBatches, TrainingBatches, epoch_walk


class Numbers:
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def batch(self, indices, rng):
        noise = 0 if rng is None else int(rng.integers(0, 1000))
        return torch.as_tensor(indices), torch.tensor(noise)


def test_epoch_walk_visits_every_example_once_per_epoch_and_epochs_differ():
    walk = epoch_walk(10, seed=3, start=0, count=30)
    for epoch in range(3):
        assert sorted(walk[epoch * 10:(epoch + 1) * 10]) == list(range(10))
    assert not np.array_equal(walk[:10], walk[10:20])
    assert np.array_equal(epoch_walk(10, 3, 7, 9), walk[7:16])  # any window of the same walk


def test_training_batch_of_a_step_is_the_same_whenever_it_is_asked_for():
    a, b = TrainingBatches(Numbers(13), 4, seed=1, steps=50), TrainingBatches(Numbers(13), 4, 1, 50)
    for step in (0, 5, 31):
        (ia, na), (ib, nb) = a[step], b[step]
        assert torch.equal(ia, ib) and int(na) == int(nb)
    assert not torch.equal(a[0][0], TrainingBatches(Numbers(13), 4, seed=2, steps=50)[0][0])


def test_ranks_take_disjoint_examples_within_an_epoch():
    ranks = [TrainingBatches(Numbers(12), 3, seed=0, steps=2, rank=r, world=2) for r in range(2)]
    seen = torch.cat([ranks[r][s][0] for s in range(2) for r in range(2)])
    assert sorted(seen.tolist()) == list(range(12))


def test_evaluation_covers_the_split_once_in_order_across_ranks():
    shards = [EvaluationBatches(Numbers(11), 4, rank=r, world=2) for r in range(2)]
    seen = sorted(i for s in shards for j in range(len(s)) for i in s[j][0].tolist())
    assert seen == list(range(11))
    assert all(int(s[j][1]) == 0 for s in shards for j in range(len(s)))  # no augmentation


def test_pixel_sequences_predict_every_subpixel_in_raster_order_channels_interleaved():
    from xformer_bench.data.pixels import BOS_ID, PixelSequences, downsample

    images = np.arange(2 * 2 * 3 * 3, dtype=np.uint8).reshape(2, 2, 3, 3)  # (N, H, W, C)
    inputs, targets = PixelSequences(images).batch(np.array([1]))
    assert targets[0].tolist() == images[1].reshape(-1).tolist()  # row, column, channel
    assert inputs[0, 0] == BOS_ID and torch.equal(inputs[0, 1:], targets[0, :-1])
    boxes = np.array([[0, 2], [4, 6]], dtype=np.uint8).reshape(1, 2, 2, 1)
    assert downsample(boxes, 1).reshape(-1).tolist() == [3]
