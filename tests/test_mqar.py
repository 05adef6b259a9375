"""MQAR: zoology's layout of pairs and power-law queries, accuracy over the
queried positions as the task's metric, each mixer's state size per layer, and the plot of
accuracy against it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import compose_config
from test_domains import run_domain
from xformer_bench.attention import TokenMixer
from xformer_bench.core.dims import ModelDims
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.models.state_size import mixer_state_bytes
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.registry import DATA
from xformer_bench.results.recall_plot import plot_recall_vs_state, recall_points
from xformer_bench.targets import IGNORE_INDEX

MQAR = {"name": "mqar", "seq_len": 64, "n_pairs": 8, "vocab_size": 64, "n_train": 64,
        "n_val": 16, "n_test": 16, "batch_size": 4}
TINY_MQAR = ("data=mqar", "data.seq_len=16", "data.n_pairs=2", "data.vocab_size=32",
             "data.n_train=64", "data.n_val=16", "data.n_test=16", "data.batch_size=4",
             "data.eval_batch_size=16")


def test_pairs_then_every_key_asked_once_at_a_later_even_position():
    dm = DATA.build(MQAR, seed=0, data_dir="unused")
    assert (dm.task, dm.unit, dm.vocab_size, dm.scores_accuracy) == ("lm", "tokens", 64, True)
    inputs, targets = dm.splits["train"].batch(np.arange(32), None)
    assert inputs.shape == targets.shape == (32, 64) and inputs.dtype == torch.int64
    for row, answers in zip(inputs.tolist(), targets.tolist()):
        keys, values = row[0:16:2], row[1:16:2]
        assert len(set(keys)) == len(set(values)) == 8
        assert all(1 <= k < 32 for k in keys) and all(32 <= v < 64 for v in values)
        asked = [i for i, a in enumerate(answers) if a != IGNORE_INDEX]
        assert len(asked) == 8 and all(i >= 16 and i % 2 == 0 for i in asked)
        assert sorted(row[i] for i in asked) == sorted(keys)  # each key once
        assert all(answers[i] == values[keys.index(row[i])] for i in asked)
    assert 0 not in inputs[:, 16:].tolist()  # the gaps hold random tokens


def test_query_gaps_follow_the_power_law():
    def mean_gap(power_a: float) -> float:
        dm = DATA.build({**MQAR, "power_a": power_a}, seed=0, data_dir="unused")
        targets = dm.splits["train"].batch(np.arange(64), None)[1]
        return float((targets != IGNORE_INDEX).nonzero()[:, 1].float().mean())

    assert mean_gap(0.01) < mean_gap(1.0) - 4  # near queries likelier than uniform's


@pytest.mark.parametrize("change, message", [
    ({"seq_len": 30}, r"set data.seq_len=32$"), ({"seq_len": 63}, r"must be even"),
    ({"vocab_size": 16}, r"set data.vocab_size >= 18$"), ({"power_a": 0.0}, r"power_a"),
    ({"n_pairs": 0}, r"data.n_pairs=0 must be >= 1"),
])
def test_sizes_that_cannot_hold_the_task_are_one_line(change, message):
    with pytest.raises(ConfigError, match=message) as error:
        DATA.build({**MQAR, **change}, seed=0, data_dir="unused")
    assert "\n" not in str(error.value)


def test_splits_are_disjoint_streams_and_reproducible():
    dm = DATA.build(MQAR, seed=0, data_dir="unused")
    val, test = (dm.splits[s].batch(np.arange(8), None)[0] for s in ("val", "test"))
    assert not torch.equal(val, test)
    again = DATA.build(MQAR, seed=1, data_dir="unused").splits["val"].batch(np.arange(8), None)[0]
    assert torch.equal(val, again)  # the data seed, not the run seed


def test_accuracy_over_the_queries_is_the_runs_metric_with_its_state_size(tmp_path):
    record = run_domain(tmp_path, *TINY_MQAR, "trainer.max_steps=2", "attention=linear")
    assert record["status"] == "finished" and record["primary_metric"] == "accuracy"
    assert record["eval_counts"] == {"val": 32, "test": 32}  # 2 queries per example
    assert 0 <= record["test"]["test/accuracy"] <= 1 and record["test"]["test/bits_per_token"] > 0
    state = record["state_bytes"]  # linear attention: H x Dh x (Dh + 1) floats per layer
    assert state["layers"] == [2 * 16 * 17 * 4] and state["per_layer"] == 2 * 16 * 17 * 4


def test_the_scored_step_counts_what_the_full_distribution_says():
    from xformer_bench.tasks.lm import LanguageModelTask

    config = compose_config(*TINY_MQAR, "model.d_model=32", "model.n_heads=2", "model.n_layers=1")
    torch.manual_seed(0)
    task = LanguageModelTask(build_model(config, 32), config["optim"], 10, "tokens", accuracy=True)
    batch = DATA.build(config["data"], seed=0, data_dir="x").splits["val"].batch(np.arange(8), None)
    with torch.no_grad():  # as evaluation runs
        task._scored_step(batch)
        log_probs = task.model(batch[0])  # (B, T, V)
        nats = task.model(batch[0], batch[1], ignore_index=IGNORE_INDEX, reduction="sum")
    scored = batch[1] != IGNORE_INDEX
    assert task.eval_nats.compute() == pytest.approx(float(nats), rel=1e-5)
    assert task.eval_correct.compute() == (log_probs[scored].argmax(-1) == batch[1][scored]).sum()
    assert [m.name for m in task.metrics] == ["accuracy", "bits_per_token"]


class Recurrent(TokenMixer):
    """A planted mixer keeping a (B, 3) state between steps, one with its own state_bytes."""

    decode_state = "recurrent"

    def forward(self, x, ctx):
        slot = ctx.cache.slot()
        slot["state"] = {"h": x[:, -1, :3].clone()}
        return x


class Declared(Recurrent):
    def state_bytes(self, seq_len, batch=1, dtype=torch.float32):
        return 123 * batch


def test_each_mixer_states_its_bytes_per_layer():
    dims = ModelDims(d_model=32, n_heads=2, n_layers=1, d_ff=64, seq_len=100, vocab_size=16)
    mixer = lambda name, **keys: build_token_mixer({"name": name, **keys}, dims)  # noqa: E731
    assert mixer_state_bytes(mixer("full"), 100, 32) == 2 * 100 * 32 * 4  # keys and values
    assert mixer_state_bytes(mixer("full"), 100, 32, dtype=torch.bfloat16) == 2 * 100 * 32 * 2
    assert mixer_state_bytes(mixer("local", window=10), 100, 32) == 2 * 10 * 32 * 4
    assert mixer_state_bytes(mixer("linear"), 100, 32) == 2 * 16 * 17 * 4  # flat in T
    assert mixer_state_bytes(mixer("performer", n_features=8), 100, 32) == 2 * 8 * 17 * 4
    assert mixer_state_bytes(mixer("multi_query"), 100, 32) == 2 * 100 * 16 * 4  # one kv head
    assert mixer_state_bytes(Recurrent(), 100, 32) == 3 * 4  # measured after one step
    assert mixer_state_bytes(Declared(), 100, 32, batch=2) == 246  # the mixer's own word
    assert mixer_state_bytes(mixer("fnet"), 100, 32) is None  # keeps nothing to decode with


def _run(attention: str, state: float, accuracy: float, seed: int) -> dict:
    return {"status": "finished", "seed": seed, "state_bytes": {"per_layer": state},
            "test": {"test/accuracy": accuracy},
            "config": {"attention": {"name": attention, "label": attention.title()},
                       "model": {"n_layers": 2},
                       "data": {"name": "mqar", "label": "MQAR", "seq_len": 64, "n_pairs": 8}}}


def test_the_recall_plot_has_a_line_per_mixer_over_state_size(tmp_path):
    runs = [_run("full", 4096, 1.0, 0), _run("linear", 2176, 0.25, 0),
            _run("linear", 2176, 0.35, 1), _run("linear", 8448, 0.5, 0),
            {**_run("linear", 1, 1.0, 2), "status": "failed"}]
    panels = recall_points(runs)
    assert list(panels) == ["MQAR T=64, 8 pairs"]
    assert panels["MQAR T=64, 8 pairs"]["Linear"] == [(2176, pytest.approx(0.3), 0.25, 0.35),
                                                      (8448, 0.5, 0.5, 0.5)]
    written = plot_recall_vs_state("mqar", runs, tmp_path / "mqar")
    assert [p.name for p in written] == ["mqar_recall_state.png", "mqar_recall_state.pdf"]
    assert plot_recall_vs_state("lm", [{**runs[0], "state_bytes": None}], tmp_path / "x") == []
