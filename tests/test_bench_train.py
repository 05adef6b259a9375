"""The training race runs every contender at one shape and compares like with like."""

from __future__ import annotations

import pytest
import torch

from xformer_bench.bench import train_race

TINY = dict(d_model=32, n_layers=1, n_heads=2, d_ff=64, seq_len=16, batch=2)


def test_the_race_times_each_contender_at_matched_size(monkeypatch):
    pytest.importorskip("x_transformers")
    monkeypatch.setitem(train_race.SIZES, "tiny", TINY)
    rows = train_race.as_rows(train_race.race("tiny", steps=2, device="cpu",
                                              precision="32-true"))
    assert [r["contender"] for r in rows] == list(train_race.CONTENDERS)
    xbench, floor, peer = rows
    assert xbench["params"] == floor["params"]  # the same model, two loops
    assert abs(peer["params"] / floor["params"] - 1) < 0.02  # configured as x-transformers is
    assert all(r["tokens_per_sec"] > 0 and r["step_memory_mib"] > 0 for r in rows)
    assert floor["vs_floor"] == 1.0 and xbench["vs_floor"] == pytest.approx(
        xbench["tokens_per_sec"] / floor["tokens_per_sec"])
    assert all(r["mfu"] is None for r in rows)  # CPU: no utilisation figure


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU path: needs CUDA")
def test_the_race_on_a_gpu_reports_bf16_throughput_and_mfu(monkeypatch):
    pytest.importorskip("x_transformers")
    monkeypatch.setitem(train_race.SIZES, "tiny", TINY)
    rows = train_race.as_rows(train_race.race("tiny", steps=3, device="cuda",
                                              precision="bf16-mixed"))
    for row in rows:
        assert row["tokens_per_sec"] > 0 and row["step_memory_mib"] > 0
        if "H100" in torch.cuda.get_device_name() or "H200" in torch.cuda.get_device_name():
            assert 0 < row["mfu"] < 1


@pytest.mark.slow  # a whole sweep in a subprocess: make test-full
def test_the_whole_run_clocks_both_contenders_from_process_start(monkeypatch):
    from xformer_bench.bench import whole_run

    monkeypatch.setitem(train_race.SIZES, "tiny", TINY)
    floor = whole_run.floor_script("tiny", steps=3)
    assert 0 <= floor["compose_seconds"] < floor["seconds"]
    assert 0 < floor["startup_seconds"] < floor["seconds"]
    run = whole_run.whole_run("floor", "default", steps=2)  # a fresh process, as a script
    assert 0 < run["tokens_per_sec"] < 2 * 16 * 128 / 0.2  # its start-up is counted
    assert run["startup_seconds"] > 0.2 and run["probe_seconds"] is None  # imports, data, model


def test_a_record_has_the_whole_runs_training_time_less_its_validations(tmp_path):
    from conftest import run_tiny

    record = run_tiny(tmp_path)
    train = record["steps"] / record["steps_per_sec"]
    assert record["training_wall_seconds"] > record["startup_seconds"] + 0.5 * train
    assert record["training_wall_seconds"] < record["startup_seconds"] + record["wall_time_sec"]
