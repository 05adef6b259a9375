"""The GPU path, exercised on CPU where it can be: precision auto, torch.compile, fused AdamW,
the validation share in the record, and a CLI that imports no torch until a run starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from conftest import compose_config, run_tiny
from xformer_bench import hardware
from xformer_bench.results.record import run_identity
from xformer_bench.tasks.optimization import adamw_with_schedule


def test_precision_auto_is_32_true_on_a_cpu_and_keeps_its_run_id(monkeypatch):
    monkeypatch.setattr(hardware, "visible_gpus", lambda: 0)
    auto = hardware.resolve_precision(compose_config())
    assert auto["trainer"]["precision"] == "32-true"
    assert run_identity(auto, {}) == run_identity(compose_config("trainer.precision=32-true"), {})


def test_precision_auto_is_bf16_mixed_on_a_gpu_with_bf16(monkeypatch):
    monkeypatch.setattr(hardware, "visible_gpus", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    assert hardware.resolve_precision(compose_config())["trainer"]["precision"] == "bf16-mixed"
    cpu = hardware.resolve_precision(compose_config("trainer.accelerator=cpu"))
    assert cpu["trainer"]["precision"] == "32-true"  # a GPU present, but not asked for


def test_a_compiled_run_trains_as_the_eager_one(tmp_path):
    eager = run_tiny(tmp_path / "a")
    compiled = run_tiny(tmp_path / "b", "trainer.compile=eager")
    assert compiled["history"] == eager["history"] and compiled["test"] == eager["test"]
    assert compiled["run_id"] != eager["run_id"]  # inductor's fused numerics are not eager's


def test_a_record_names_the_device_it_trained_on(monkeypatch):
    monkeypatch.setattr(hardware, "visible_gpus", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "NVIDIA H100 80GB HBM3")
    assert hardware.trained_on({"accelerator": "auto"}) == "NVIDIA H100 80GB HBM3"
    assert hardware.trained_on({"accelerator": "cpu"}) == "cpu"  # a GPU present, not asked for
    monkeypatch.setattr(hardware, "visible_gpus", lambda: 0)
    assert hardware.trained_on({"accelerator": "auto"}) == "cpu"


def test_a_record_says_how_long_validation_and_start_up_took(tmp_path):
    record = run_tiny(tmp_path)
    assert record["device"] == "cpu"
    assert 0 < record["validation_seconds"] < record["wall_time_sec"]
    assert 0 < record["setup_seconds"] < record["startup_seconds"]  # the process began earlier
    assert 0 < record["probe_seconds"] < record["setup_seconds"]  # FLOPs, memory, pairs


def test_adamw_is_fused_only_where_the_parameters_are_on_a_gpu():
    model = torch.nn.Linear(4, 4)
    optimizer = adamw_with_schedule(model, compose_config()["optim"], 10)["optimizer"]
    assert not optimizer.defaults["fused"]
    if torch.cuda.is_available():
        optimizer = adamw_with_schedule(model.cuda(), compose_config()["optim"], 10)["optimizer"]
        assert optimizer.defaults["fused"]


@pytest.mark.parametrize("module", ["xformer_bench.cli", "xformer_bench.preflight"])
def test_the_command_line_imports_no_torch_or_lightning_before_a_run(module):
    probe = (f"import sys, {module}; "
             "print(sorted(m for m in ('torch', 'lightning') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]


def test_training_metrics_are_logged_only_on_the_steps_a_logger_writes(tmp_path, monkeypatch):
    """Without a progress bar, per-step metrics are logged on the logger's schedule only (a
    log call costs ~1 ms on a CPU) -- and every row the logger writes still has them."""
    import csv

    import lightning as L

    logged, log = [], L.LightningModule.log
    monkeypatch.setattr(L.LightningModule, "log",
                        lambda self, name, *a, **k: (logged.append(name), log(self, name, *a, **k)))
    run_tiny(tmp_path, "logger=csv", "trainer.log_every_n_steps=4")
    assert logged.count("train/loss") == 4  # of 16 steps
    [metrics] = (tmp_path / "run").rglob("metrics.csv")
    rows = [r for r in csv.DictReader(metrics.open()) if r.get("train/loss")]
    assert [int(r["step"]) for r in rows] == [3, 7, 11, 15]
    assert all(r["train/bpb"] and r["train/steps_per_sec"] for r in rows[1:])


def test_per_step_seeding_skips_the_lazy_cuda_seeding_of_a_cpu_run(tmp_path, monkeypatch):
    """torch.manual_seed seeds CUDA (and XPU, MTIA) lazily where they are not in use, taking a
    stack trace each time: ~1.5 ms a step if done per step."""
    import torch.cuda.random

    calls, lazy = [], torch.cuda._lazy_call
    monkeypatch.setattr(torch.cuda.random, "_lazy_call",
                        lambda *a, **k: (calls.append(1), lazy(*a, **k))[1])
    run_tiny(tmp_path, "trainer.accelerator=cpu")  # 16 steps (on a GPU, CUDA is seeded a step)
    assert len(calls) <= 2  # seed_everything's, not one a step


def test_a_fused_optimizer_in_bf16_still_clips_gradients(tmp_path, monkeypatch):
    """Lightning's mixed-precision plugin refuses to clip for an optimizer that unscales
    internally -- fused AdamW, xbench's on a GPU -- even in bf16, which has no scaler (found on
    an H200: every GPU run failed at its first step); the task clips by global norm itself."""
    adamw, clipped = torch.optim.AdamW, []
    clip = torch.nn.utils.clip_grad_norm_
    monkeypatch.setattr(torch.optim, "AdamW", lambda *a, **k: adamw(*a, **{**k, "fused": True}))
    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_",
                        lambda params, value, *a, **k: (clipped.append(value),
                                                        clip(params, value, *a, **k))[1])
    record = run_tiny(tmp_path, "trainer.precision=bf16-mixed", "trainer.accelerator=cpu",
                      "trainer.gradient_clip_val=0.5")
    assert record["status"] == "finished"
    assert clipped and set(clipped) == {0.5}  # every step, at the configured norm
