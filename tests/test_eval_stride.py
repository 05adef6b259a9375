"""``eval.stride``: sliding evaluation windows that score each byte once, with the promised
context (Al-Rfou et al. 2019)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import run_tiny
from xformer_bench.data.byte_windows import ByteLMDataModule, EvalWindows
from xformer_bench.errors import ConfigError
from xformer_bench.targets import IGNORE_INDEX


def _scored(n_bytes: int, seq_len: int, stride: int | None, batch: int = 3):
    """{data position of each scored target: [its context lengths]} over the whole split."""
    assert n_bytes <= 256  # data[i] = i: an input byte names its own position
    windows = EvalWindows(np.arange(n_bytes, dtype=np.uint8), seq_len, batch, stride=stride)
    seen: dict[int, list[int]] = {}
    for j in range(len(windows)):
        inputs, targets = windows[j]
        for row in range(len(targets)):
            for offset in np.flatnonzero(targets[row].numpy() != IGNORE_INDEX):
                assert targets[row, offset] == inputs[row, 0] + offset + 1  # the next byte
                seen.setdefault(int(targets[row, offset]), []).append(int(offset))
    return seen


@pytest.mark.parametrize("n_bytes, seq_len, stride", [(200, 16, None), (200, 16, 4),
                                                       (200, 16, 16), (200, 16, 1), (17, 16, 4),
                                                       (250, 32, 5)])
def test_every_byte_is_scored_exactly_once_with_the_promised_context(n_bytes, seq_len, stride):
    seen = _scored(n_bytes, seq_len, stride)
    assert sorted(seen) == list(range(1, n_bytes))  # every byte but the first
    assert all(len(offsets) == 1 for offsets in seen.values())  # exactly once
    s = stride or seq_len
    for position, (context,) in seen.items():
        if position > seq_len:  # beyond the first window
            assert context >= seq_len - s


def test_the_datamodule_checks_the_stride_and_describes_its_protocol():
    module = ByteLMDataModule({"val": np.zeros(100, np.uint8)}, seq_len=16, batch_size=2, seed=0)
    assert module.eval_protocol()["windows"] == "non-overlapping"
    module.evaluate_with_stride(4)
    assert module.eval_protocol() == {"windows": "sliding", "seq_len": 16, "stride": 4,
                                      "min_context": 12}
    with pytest.raises(ConfigError, match="eval.stride=17 must be between 1 and data.seq_len=16"):
        module.evaluate_with_stride(17)


def test_a_strided_run_counts_the_same_bytes_and_records_its_protocol(tmp_path):
    plain = run_tiny(tmp_path / "a")
    strided = run_tiny(tmp_path / "b", "eval.stride=8")
    assert strided["eval_counts"] == plain["eval_counts"]
    assert strided["eval_protocol"]["min_context"] == 24 and strided["status"] == "finished"
    assert plain["eval_protocol"]["windows"] == "non-overlapping"
