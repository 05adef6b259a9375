"""Sparse targets (MQAR's queries): the lm task runs the output head at the scored columns
only (``scored_per_example``), and its training loss, gradients and evaluation counts are those
of the head over every position."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import compose_config
from test_mqar import TINY_MQAR
from xformer_bench.models.build import build_model
from xformer_bench.registry import DATA
from xformer_bench.targets import IGNORE_INDEX, scored_columns
from xformer_bench.tasks.lm import LanguageModelTask

PAIRS = 2  # TINY_MQAR's data.n_pairs


def test_columns_put_each_rows_scored_targets_first_in_order():
    targets = torch.full((3, 6), IGNORE_INDEX)
    targets[0, [1, 4]] = 7
    targets[1, [0]] = 5  # fewer than per_example: an ignored column fills the row
    targets[2, [2, 3]] = 9
    columns = scored_columns(targets, 2)
    assert columns[0].tolist() == [1, 4] and columns[2].tolist() == [2, 3]
    assert columns[1, 0] == 0 and targets[1, columns[1, 1]] == IGNORE_INDEX


def _task(per_example: int | None) -> tuple[LanguageModelTask, tuple[torch.Tensor, ...]]:
    config = compose_config(*TINY_MQAR, "model.d_model=32", "model.n_heads=2",
                            "model.n_layers=1")
    torch.manual_seed(0)
    task = LanguageModelTask(build_model(config, 32), config["optim"], 10, "tokens",
                             accuracy=True, scored_per_example=per_example)
    dm = DATA.build(config["data"], seed=0, data_dir="x")
    assert dm.scored_per_example == PAIRS
    return task, dm.splits["val"].batch(np.arange(8), None)


def test_the_loss_and_its_gradients_at_the_scored_columns_are_the_whole_heads():
    losses, grads = [], []
    for per_example in (None, PAIRS):
        task, batch = _task(per_example)
        loss = task._nats(batch, "mean")
        loss.backward()
        losses.append(loss.detach())
        grads.append(torch.cat([p.grad.flatten() for p in task.model.parameters()
                                if p.grad is not None]))
    torch.testing.assert_close(losses[1], losses[0])
    torch.testing.assert_close(grads[1], grads[0])


def test_evaluation_at_the_scored_columns_counts_what_the_whole_head_counts():
    counts = []
    for per_example in (None, PAIRS, PAIRS - 1):  # the last drops a query: planted, must differ
        task, batch = _task(per_example)
        with torch.no_grad():
            task._scored_step(batch)
        counts.append((float(task.eval_nats.compute()), int(task.eval_count.compute()),
                       int(task.eval_correct.compute())))
    assert counts[1][1:] == counts[0][1:] and counts[1][0] == pytest.approx(counts[0][0], rel=1e-5)
    assert counts[2][1] == counts[0][1] // 2
