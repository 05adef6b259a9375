"""A whole run in-process: record schema, determinism, divergence recorded."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from conftest import compose_config, run_tiny
from xformer_bench.errors import DivergedError
from xformer_bench.results import record as records
from xformer_bench.metric_spec import BITS_PER


def test_a_run_writes_a_complete_record_in_both_places(tmp_path):
    record = run_tiny(tmp_path)
    results_file = tmp_path / "results" / "default" / f"{record['run_id']}.json"
    on_disk = records.load(results_file)
    assert on_disk == records.load(tmp_path / "run" / "record.json")
    assert on_disk["status"] == "finished" and on_disk["steps"] == 16
    assert on_disk["choices"]["attention"] == "full" and on_disk["seed"] == 0
    d, v, ff = 32, 256, 64  # tied embedding + sinusoidal: embedding, 1 block, final norm
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * ff + ff) + (ff * d + d) + 2 * 2 * d
    assert on_disk["params"] == v * d + block + 2 * d
    assert on_disk["flops_per_step"] > 6 * on_disk["params"] * 4 * 32 * 0.5
    assert (on_disk["flops_analytic"], on_disk["flops_uncounted"]) == ({}, [])  # all counted
    assert on_disk["model_report"] == {}  # no layer reports a learned quantity
    assert on_disk["steps_per_sec"] > 0 and on_disk["tokens_per_sec"] == pytest.approx(
        on_disk["steps_per_sec"] * 4 * 32)
    assert on_disk["early"]["step"] == 2 and on_disk["final"]["step"] == 16
    assert on_disk["final"]["val/bpb"] == pytest.approx(on_disk["final"]["val/loss"] / math.log(2))
    assert on_disk["test"]["test/bpb"] < 8.5
    assert (on_disk["schema"], on_disk["task"], on_disk["primary_metric"]) == (2, "lm", "bpb")
    assert on_disk["metrics"] == [BITS_PER["bytes"].as_record()]
    assert (on_disk["eval_unit"], on_disk["eval_counts"]) == ("bytes", {"val": 999, "test": 999})
    assert on_disk["peak_memory_mb"] > 0 and on_disk["wall_time_sec"] > 0
    assert not list((tmp_path / "results" / "default").glob(".*tmp"))  # no partial files left


def test_same_seed_gives_identical_losses_and_another_seed_does_not(tmp_path):
    first = run_tiny(tmp_path / "a", "seed=3")
    second = run_tiny(tmp_path / "b", "seed=3")
    other = run_tiny(tmp_path / "c", "seed=4")
    assert first["final"]["val/loss"] == second["final"]["val/loss"]
    assert first["test"] == second["test"]
    assert first["run_id"] == second["run_id"] != other["run_id"]
    assert first["final"]["val/loss"] != other["final"]["val/loss"]


def test_a_diverging_run_is_recorded_as_diverged(tmp_path):
    with pytest.raises(DivergedError, match="training loss is nan"):
        run_tiny(tmp_path, "optim.lr=1e30", "trainer.gradient_clip_val=0")
    [path] = (tmp_path / "results" / "default").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "diverged" and "nan" in record["error"]


def test_run_identity_ignores_where_files_go_but_not_what_is_trained():
    base = compose_config()
    moved = compose_config("paths.results_dir=/elsewhere", "paths.data_dir=/x", "logger=none")
    changed = compose_config("optim.lr=0.5")
    choices = {"model": "vanilla"}
    assert records.run_identity(base, choices) == records.run_identity(moved, choices)
    assert records.run_identity(base, choices) != records.run_identity(changed, choices)


def test_an_option_added_at_its_neutral_value_keeps_older_run_ids():
    base = compose_config()
    older = {**base, "model": {k: v for k, v in base["model"].items()
                               if k not in records.IDENTITY_NEUTRAL["model"]}}
    choices = {"model": "vanilla"}
    assert records.run_identity(base, choices) == records.run_identity(older, choices)
    gated = compose_config("model.residual=gru_gate")
    assert records.run_identity(gated, choices) != records.run_identity(base, choices)


def test_run_identity_ignores_the_study_declaration_around_a_run():
    """Adding an option to a study's sweep list must not orphan the records already run."""
    study = compose_config("experiment=attention_zoo")
    grown = compose_config("experiment=attention_zoo", "sweep.attention='full,local,new_option'",
                           "baseline.attention=local")
    choices = {"model": "vanilla"}
    assert records.run_identity(study, choices) == records.run_identity(grown, choices)


def test_record_validation_rejects_missing_keys_and_unknown_status(tmp_path):
    with pytest.raises(ValueError, match="lacks"):
        records.validate({"status": "finished"})
    complete = {k: None for k in records.REQUIRED_KEYS} | {"status": "exploded"}
    with pytest.raises(ValueError, match="status"):
        records.validate(complete)
    path = records.write_json_atomic(tmp_path / "r.json", complete | {"status": "failed"})
    assert records.load(Path(path))["status"] == "failed"


def test_resuming_from_a_checkpoint_gives_the_same_result(tmp_path):
    options = ("trainer.checkpoint=true", "trainer.val_checks=2")
    straight = run_tiny(tmp_path / "a", *options)
    halfway = tmp_path / "a" / "run" / "checkpoints" / "step-8.ckpt"
    assert halfway.is_file() and (halfway.parent / "last.ckpt").is_file()
    resumed = run_tiny(tmp_path / "b", *options, f"resume={halfway}")
    assert resumed["run_id"] == straight["run_id"] and resumed["steps"] == 16
    assert resumed["final"] == straight["final"]
    assert resumed["test"] == straight["test"]


def test_a_new_record_has_every_required_key_and_starts_failed(tmp_path):
    from conftest import compose_config

    config = compose_config()
    record = records.new_record(config, {"model": "vanilla"}, ["seed=0"], tmp_path)
    records.validate(record)
    assert set(records.REQUIRED_KEYS) <= set(record) and record["status"] == "failed"
    assert all(record[k] is None for k in records.MEASURED)
    assert record["run_id"] == records.run_identity(config, {"model": "vanilla"})


def test_a_layer_that_learns_a_quantity_reports_it_in_the_record(tmp_path):
    record = run_tiny(tmp_path, "attention=adaptive_span", "attention.init_span=16",
                      "attention.max_span=64")
    span = record["model_report"]["mean_span"]  # averaged over layers and heads
    assert 0 < span <= 64 and span == pytest.approx(16, abs=2)  # init 16, after 16 small steps


def test_a_run_measures_its_own_peak_memory_not_the_process_high_water_mark():
    """Runs of a sweep share a process: each resets the peak when it starts."""
    from xformer_bench.training.peak_memory import RunPeakMemory

    ballast = torch.ones(128 * 2**20, dtype=torch.uint8)  # 128 MiB resident, then freed
    del ballast
    memory = RunPeakMemory()
    memory.start()
    held = torch.ones(16 * 2**20, dtype=torch.uint8)
    mib, kind = memory.read()
    if kind != "cpu_peak_rss":
        pytest.skip(f"no resettable peak RSS here ({kind})")
    rss_now = float(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text())[1]) / 1024
    assert rss_now - 1 <= mib < rss_now + 48  # this run's peak, not the earlier 128 MiB
    del held


def test_a_run_records_its_training_step_memory_without_changing_training(tmp_path):
    """Measured before training on the real model, in eval mode and on its own random numbers:
    the run's result is the one it would have had (the pinned-results test guards the same)."""
    from xformer_bench.training.step_memory import training_step_memory

    config = compose_config("model.d_model=32", "model.n_heads=2", "model.n_layers=2",
                            "model.d_ff=64", "data.seq_len=64")
    from xformer_bench.models.build import build_model

    model = build_model(config, 256)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    small = training_step_memory(model, 64, 2, 256)
    large = training_step_memory(model, 64, 8, 256)
    assert torch.equal(torch.get_rng_state(), rng) and model.training
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert 3.0 < large / small < 4.5  # activations grow with the batch
    record = run_tiny(tmp_path)
    assert record["step_memory_mb"] > 0
