"""Transformer-XL's evaluation protocol (Dai et al. 2019): a model with memory is
scored over the split as streams -- ``eval.lanes`` lanes, ``eval.tgt_len`` segments,
``stack.eval_mem_len`` memory, each lane warmed on the text before it (``eval.warm``) -- every
byte once, with the memory one stream over the whole split gives it, against references written
out here."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, run_tiny
from xformer_bench.data.byte_windows import ByteLMDataModule, EvalWindows
from xformer_bench.data.eval_streams import StreamEvalWindows
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.results.record import identity_config
from xformer_bench.run import _stream_if_remembered
from xformer_bench.targets import IGNORE_INDEX
from xformer_bench.tasks.lm import build as build_task

DIMS = ("data.seq_len=8", "model.d_model=32", "model.n_heads=2", "model.d_ff=64")
DATA = np.random.default_rng(0).integers(0, 256, 150).astype(np.uint8)


def evaluation(*overrides: str, n_layers: int = 1, data: np.ndarray = DATA):
    """The task and the data module as a run builds them (task first, then the streams), over
    a test split of ``data``, the weights drawn from seed 0."""
    config = compose_config("model=transformer_xl", *DIMS, "stack.mem_len=8",
                            f"model.n_layers={n_layers}", *overrides)
    module = ByteLMDataModule({"test": data}, seq_len=8, batch_size=2, seed=0, eval_batch_size=4)
    torch.manual_seed(0)
    task = build_task(config, module)
    _stream_if_remembered(config, module, task.model)
    task.model.eval()
    return task, module


def per_byte(task, module) -> dict[int, float]:
    """{position of each scored byte: its nats} as the task scores the test split, window
    after window (the same windows over byte positions say which byte each target is)."""
    windows = module.test_dataloader().dataset
    where = copy.copy(windows)
    where.data = np.arange(len(windows.data))
    task.on_test_epoch_start()  # the memory forgotten, as at every evaluation
    scored: dict[int, float] = {}
    with torch.no_grad():
        for j in range(len(windows)):
            nats = task._nats(windows[j], "none")  # (B T,)
            for q, n in zip(where[j][1].flatten().tolist(), nats.tolist()):
                if q != IGNORE_INDEX:
                    assert q not in scored
                    scored[q] = n
    return scored


def assert_same_bytes(a: dict[int, float], b: dict[int, float]) -> None:
    assert sorted(a) == sorted(b) == list(range(1, len(DATA)))
    torch.testing.assert_close(torch.tensor([a[q] for q in sorted(a)]),
                               torch.tensor([b[q] for q in sorted(a)]), atol=2e-5, rtol=0)


# ------------------------------------------------------------------ every byte once, in place


@pytest.mark.parametrize("n_bytes,segment,lanes,warmup,shards", [
    (1000, 16, 4, 64, 1), (333, 7, 5, 14, 2), (17, 16, 4, 32, 1), (2, 4, 3, 8, 1),
    (200, 8, 1, 16, 1), (150, 8, 3, 0, 2)])
def test_warmed_lanes_score_every_byte_once_after_reading_their_warmup(
        n_bytes, segment, lanes, warmup, shards):
    positions = np.arange(n_bytes)  # data[i] = i: every input and target names its position
    ranks = [StreamEvalWindows(positions, segment, lanes, shard=r, n_shards=shards,
                               warmup=warmup) for r in range(shards)]
    assert len({len(windows) for windows in ranks}) == 1  # every rank walks as many windows
    scored = []
    for windows in ranks:
        batches = [windows[j] for j in range(len(windows))]
        for row in range(lanes):
            inputs = torch.cat([x[row] for x, _ in batches]) if batches else torch.empty(0)
            targets = torch.cat([y[row] for _, y in batches]) if batches else torch.empty(0)
            mine = targets[targets != IGNORE_INDEX]
            scored.append(mine)
            if not len(mine):
                continue  # a lane beyond the split's end
            read = int(inputs[0])
            assert read % segment == 0  # on the segments of one stream from byte 0
            assert torch.equal(inputs, (read + torch.arange(len(inputs))).clamp(max=n_bytes - 1))
            # the lane read min(warmup, its start) bytes before its first target, unscored
            assert int(mine[0]) - 1 - read == min(warmup, int(mine[0]) - 1)
    assert torch.equal(torch.sort(torch.cat(scored)).values, torch.arange(1, n_bytes))
    plain = EvalWindows(positions, segment, lanes)  # the non-stream evaluation's count
    assert sum(int((plain[j][1] != IGNORE_INDEX).sum()) for j in range(len(plain))) == n_bytes - 1


# ------------------------------------------------------------------ against explicit references


def one_layer_reference(task, memory: int, segment: int) -> dict[int, float]:
    """Each byte's nats by one layer of Dai et al.'s recurrence over a single stream, written
    out: the byte after input p, whose segment starts at s = p - p mod ``segment``, is predicted
    from the ``memory`` bytes before s and the segment up to p -- the memory-less model (same
    weights, stack=standard) run on bytes max(0, s - memory) .. p, its last output."""
    config = compose_config("model=transformer_xl", *DIMS, "model.n_layers=1", "stack=standard")
    twin = build_model(config, vocab_size=256).eval()
    twin.load_state_dict(task.model.state_dict())
    tokens = torch.from_numpy(DATA.astype(np.int64))
    out = {}
    with torch.no_grad():
        for q in range(1, len(DATA)):
            s = (q - 1) - (q - 1) % segment
            log_probs = twin(tokens[max(0, s - memory):q][None])[0, -1:]  # (1, V)
            out[q] = F.cross_entropy(log_probs, tokens[q:q + 1]).item()
    return out


@pytest.mark.parametrize("lanes", [1, 3])
def test_the_protocol_scores_each_byte_with_the_memory_it_prescribes(lanes):
    """Evaluation memory 6 over segments of 4 (training: 8 and 8), warmed lanes."""
    task, module = evaluation("stack.eval_mem_len=6", "eval.tgt_len=4", f"eval.lanes={lanes}",
                              "eval.warm=true")
    assert module.eval_protocol() == {"windows": "streams", "seq_len": 4, "stride": 4,
                                      "min_context": 0, "lanes": lanes, "memory": 6,
                                      "warmup": 8}  # 1 layer x 6 bytes, in whole segments
    assert_same_bytes(per_byte(task, module), one_layer_reference(task, memory=6, segment=4))


def cold_lane_start(n_bytes: int, lanes: int, lane: int) -> int:
    """Input position of a cold lane's first target: lanes of ceil(targets / lanes) bytes."""
    return lane * -(-(n_bytes - 1) // lanes)


COMPRESSIVE = ("stack=compressive", "stack.mem_len=4", "stack.cmem_len=2",
               "stack.compression_rate=2")
"""c = 2 divides the segment (8): a warmed lane's c-groups fall where one stream's do."""


@pytest.mark.parametrize("stack", [(), COMPRESSIVE], ids=["recurrent", "compressive"])
def test_warming_makes_lanes_equal_one_stream_and_cold_lanes_differ(stack):
    one_stream = per_byte(*evaluation(*stack, "eval.lanes=1", n_layers=2))
    task, warmed = evaluation(*stack, "eval.lanes=3", "eval.warm=true", n_layers=2)
    # 2 layers x 8 bytes (reach 8) | 2 x 16 (reach 4 + (c - 1) + 2 slots x c = 9)
    assert warmed.warmup == (16 if not stack else 32)
    assert_same_bytes(per_byte(task, warmed), one_stream)
    cold = per_byte(*evaluation(*stack, "eval.lanes=3", "eval.warm=false", n_layers=2))
    lane_1 = cold_lane_start(len(DATA), 3, 1)  # cold: lane 1 starts without memory
    assert abs(cold[lane_1 + 1] - one_stream[lane_1 + 1]) > 1e-3
    assert all(cold[q] == pytest.approx(one_stream[q], abs=2e-5) for q in range(1, 9))


def test_a_warmup_of_one_memory_is_not_enough_for_two_layers():
    """The planted violation: warming each lane on one memory's span (8 bytes) fills its
    memory, but with second-layer states that lacked one -- the bytes differ from one stream."""
    one_stream = per_byte(*evaluation("eval.lanes=1", n_layers=2))
    task, short = evaluation("eval.lanes=3", "eval.warm=true", n_layers=2)
    short.warmup = 8
    scored = per_byte(task, short)
    assert max(abs(scored[q] - one_stream[q]) for q in scored) > 1e-4


# ------------------------------------------------------------------ configuration and record


def test_bad_protocol_keys_are_one_line_each():
    module = ByteLMDataModule({"test": DATA}, seq_len=8, batch_size=2, seed=0)
    for keys, words in [({"tgt_len": 0}, "eval.tgt_len=0 must be an integer between 1 and "
                         "data.seq_len=8"), ({"tgt_len": 9}, "eval.tgt_len=9"),
                        ({"lanes": 0}, "eval.lanes=0 must be a positive integer"),
                        ({"lanes": 1.5}, "eval.lanes=1.5"),
                        ({"warm": "yes"}, "eval.warm=yes must be true or false")]:
        with pytest.raises(ConfigError, match=words) as error:
            module.evaluate_streams(**keys)
        assert "\n" not in str(error.value)


def test_the_record_says_which_protocol_scored_the_test_metric(tmp_path):
    from xformer_bench.run import _build_datamodule

    xl = run_tiny(tmp_path / "xl", "model=transformer_xl", "trainer.max_steps=2")
    assert xl["eval_protocol"] == {"windows": "streams", "seq_len": 32, "stride": 32,
                                   "min_context": 0, "lanes": 10, "memory": 32, "warmup": 32}
    splits = _build_datamodule(compose_config("data.size=20000")).splits
    assert xl["eval_counts"] == {"val": len(splits["val"]) - 1, "test": len(splits["test"]) - 1}
    plain = run_tiny(tmp_path / "plain", "stack=recurrent", "position=xl_relative",
                     "trainer.max_steps=2")  # no preset: the house's cold lanes
    assert plain["eval_protocol"]["lanes"] == 16 and plain["eval_protocol"]["warmup"] is None
    assert plain["eval_counts"] == xl["eval_counts"]


def test_the_new_keys_at_their_defaults_keep_older_run_ids():
    assert not {"tgt_len", "lanes", "warm"} & set(identity_config(compose_config()).get("eval", {}))
    assert identity_config(compose_config("model=transformer_xl"))["eval"] == {"lanes": 10,
                                                                               "warm": True}
