"""Nothing lost: a run stopped at any point continues to the result an uninterrupted run gets.

In-process: a SIGTERM at a step saves a resume point and records ``interrupted``; the same
run again (``resume=auto``) ends with the uninterrupted run's metrics and history, dropout
included (the random numbers are per step).  Resume points are atomic, the last two kept, a
corrupt newest skipped with a warning; another configuration's checkpoint is refused; a
diverged run keeps its last good point; an unwritable results folder is an error before
training.  Subprocesses: SIGKILL at three points (one during validation, one while a resume
point is being written) and SIGTERM under a fake SLURM that requeues.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN, XBENCH, run_tiny
from xformer_bench.errors import ConfigError, DivergedError
from xformer_bench.training import checkpoints
from xformer_bench.training.preemption import RunInterrupted
from xformer_bench.training.throughput import Throughput

AUTO = ("resume=auto", "trainer.val_checks=4", "trainer.checkpoint_every=3", "model.dropout=0.1")
SAME = ("final", "early", "history", "test", "steps", "params", "run_id")


def _points(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "results" / "checkpoints").rglob("step-*.ckpt"))


def _signal_at(monkeypatch, step: int, signum: int = signal.SIGTERM) -> None:
    """Send ``signum`` to this process when training reaches ``step``."""
    original = Throughput.on_train_batch_end

    def on_train_batch_end(self, trainer, *args):
        original(self, trainer, *args)
        if trainer.global_step == step:
            os.kill(os.getpid(), signum)

    monkeypatch.setattr(Throughput, "on_train_batch_end", on_train_batch_end)


@pytest.mark.parametrize("step,point,extra", [
    (5, 5, ()), (8, 6, ()),  # 8: a validation follows
    # Performer, redraws before steps 5, 9, 13: resumed from step 4's point, an interval's end
    (8, 4, ("attention=performer", "attention.redraw_interval=4", "attention.n_features=8",
            "trainer.checkpoint_every=4"))])
def test_a_terminated_run_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, step,
                                                              point, extra):
    straight = run_tiny(tmp_path / "straight", *AUTO, *extra)
    assert straight["status"] == "finished" and straight["resumed_from"] is None
    assert _points(tmp_path / "straight") == []  # a finished run's resume points are removed

    with monkeypatch.context() as patch:
        _signal_at(patch, step)
        with pytest.raises(RunInterrupted, match=f"SIGTERM at step {step}"):
            run_tiny(tmp_path / "cut", *AUTO, *extra)
    [path] = (tmp_path / "cut" / "results" / "default").glob("*.json")
    assert json.loads(path.read_text())["status"] == "interrupted"
    assert _points(tmp_path / "cut")[-1].name == f"step-{point:08d}.ckpt"

    resumed = run_tiny(tmp_path / "cut", *AUTO, *extra)
    assert resumed["status"] == "finished" and resumed["resumed_from"].endswith(
        f"step-{point:08d}.ckpt")
    assert {k: resumed[k] for k in SAME} == {k: straight[k] for k in SAME}


def test_resume_points_are_the_last_two_and_a_corrupt_newest_is_skipped(tmp_path, capsys):
    folder = tmp_path / "points"
    folder.mkdir()
    for step in (2, 4):
        torch.save({"global_step": step}, folder / f"step-{step:08d}.ckpt")
    (folder / "step-00000006.ckpt").write_bytes(b"PK\x03\x04 cut short")
    found = checkpoints.latest_valid(folder)
    assert found == folder / "step-00000004.ckpt"
    assert "skipped checkpoint" in capsys.readouterr().out


def test_only_the_last_two_resume_points_are_kept(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        _signal_at(patch, 13)
        with pytest.raises(RunInterrupted):
            run_tiny(tmp_path, *AUTO)
    assert [p.name for p in _points(tmp_path)] == ["step-00000012.ckpt", "step-00000013.ckpt"]
    assert not list((tmp_path / "results" / "checkpoints").rglob("*.tmp"))


def test_a_checkpoint_of_another_configuration_is_refused(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        _signal_at(patch, 4)
        with pytest.raises(RunInterrupted):
            run_tiny(tmp_path, *AUTO)
    [point] = _points(tmp_path)
    with pytest.raises(ConfigError, match=r"another configuration \(model.d_model: 32 there, "
                                          r"48 here\)"):
        run_tiny(tmp_path / "other", "trainer.val_checks=4", "model.d_model=48",
                 f"resume={point}")
    with pytest.raises(ConfigError, match="no such checkpoint"):
        run_tiny(tmp_path / "other", f"resume={tmp_path / 'nowhere.ckpt'}")


def test_a_diverged_run_keeps_its_last_good_resume_point(tmp_path, monkeypatch):
    from xformer_bench.tasks import base

    original = base.check_finite

    def nan_from_step_7(loss, step, strategy=None):
        original(loss * float("nan") if step >= 7 else loss, step, strategy)

    monkeypatch.setattr(base, "check_finite", nan_from_step_7)
    with pytest.raises(DivergedError, match="at step 7"):
        run_tiny(tmp_path, *AUTO)
    assert _points(tmp_path)[-1].name == "step-00000006.ckpt"


def test_an_unwritable_results_folder_is_an_error_before_training(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(ConfigError, match="cannot write run records to .*paths.results_dir"):
        run_tiny(tmp_path, f"paths.results_dir={blocked}")


# -- subprocesses: SIGKILL and a SLURM requeue ---------------------------------------------

SLOW_EVAL = ("data.size=1000000", "data.eval_batch_size=8",  # a validation takes a while
             "trainer.checkpoint_every=1", "model.d_model=128", "model.n_heads=4",
             "model.d_ff=512", "model.n_layers=2")  # resume points of ~10 MB take a while


def _start(tmp_path: Path, *extra: str, env: dict | None = None) -> subprocess.Popen:
    args = [*XBENCH, *TINY_RUN, *AUTO, *SLOW_EVAL, "paths.results_dir=results",
            "experiment_name=kills", *extra]
    return subprocess.Popen(args, cwd=tmp_path, env={**os.environ, **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(condition, process: subprocess.Popen, timeout: float = 120.0,
              pause: float = 0.002) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, process.communicate()[1][-2000:]
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(pause)


def _record(tmp_path: Path) -> dict:
    [path] = (tmp_path / "results" / "kills").glob("*.json")
    return json.loads(path.read_text())


@pytest.mark.slow
def test_sigkill_at_three_points_then_the_same_command_gives_the_uninterrupted_record(
        tmp_path):
    straight_dir = tmp_path / "straight"
    straight_dir.mkdir()
    assert _start(straight_dir).wait(timeout=300) == 0
    straight = _record(straight_dir)

    cut = tmp_path / "cut"
    cut.mkdir()
    folder = cut / "results" / "checkpoints" / "kills" / straight["run_id"]
    def validating() -> bool:  # step 8 trains in milliseconds, then validates for seconds
        seven = folder / "step-00000007.ckpt"
        return seven.is_file() and time.time() - seven.stat().st_mtime > 0.5

    kill_points = [
        lambda: any(folder.glob(".step-*.tmp")),            # while a point is written
        lambda: (folder / "step-00000005.ckpt").is_file(),  # mid-training
        validating,
    ]
    for reached in kill_points:
        run = _start(cut)
        _wait_for(reached, run, pause=0.0 if reached is kill_points[0] else 0.002)
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=60)
        if reached is validating:  # killed before that validation ended (and saved step 8)
            assert not (folder / "step-00000008.ckpt").exists()
    assert _start(cut).wait(timeout=300) == 0
    resumed = _record(cut)
    assert resumed["status"] == "finished" and resumed["resumed_from"]
    assert {k: resumed[k] for k in SAME} == {k: straight[k] for k in SAME}


@pytest.mark.slow
def test_sigterm_under_slurm_saves_requeues_and_the_requeued_job_finishes(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'scontrol.args'}\n")
    (fake / "scontrol").chmod(0o755)
    env = {"SLURM_JOB_ID": "4242", "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"}
    run = _start(tmp_path, env=env)
    folder = tmp_path / "results" / "checkpoints" / "kills"
    _wait_for(lambda: any(folder.rglob("step-00000003.ckpt")), run)
    run.send_signal(signal.SIGTERM)
    _, stderr = run.communicate(timeout=120)
    assert run.returncode != 0 and "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "SIGTERM at step" in errors[0] and "requeued" in errors[0]
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "4242"]
    assert _record(tmp_path)["status"] == "interrupted"

    requeued = _start(tmp_path, env=env)  # what SLURM starts again
    assert requeued.wait(timeout=300) == 0
    assert _record(tmp_path)["status"] == "finished" and _record(tmp_path)["resumed_from"]
    assert not list(folder.rglob("*.ckpt"))




def test_a_resume_point_is_never_saved_with_nan_parameters(tmp_path, monkeypatch):
    """On a GPU the loss is checked every few steps; the parameters are checked before any
    point is saved, so a divergence between two checks still keeps the last good point."""
    from xformer_bench.tasks import base

    monkeypatch.setattr(base, "check_finite", lambda *args: None)  # no loss check at all
    original = Throughput.on_train_batch_end

    def poison_at_step_7(self, trainer, pl_module, *args):
        original(self, trainer, pl_module, *args)
        if trainer.global_step == 7:
            with torch.no_grad():
                next(pl_module.parameters()).fill_(float("nan"))

    monkeypatch.setattr(Throughput, "on_train_batch_end", poison_at_step_7)
    with pytest.raises(DivergedError, match="parameters are NaN or infinite at step 8"):
        run_tiny(tmp_path, *AUTO)
    assert _points(tmp_path)[-1].name == "step-00000006.ckpt"
