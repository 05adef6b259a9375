"""Studies as configs: `xbench -m experiment=...` sweeps, skips what finished, survives failures."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import TINY_RUN, compose_config
from conftest import XBENCH
from conftest import xbench as _xbench
from xformer_bench.cli import run_job
from xformer_bench.results import record as records

CHOICES = ("model", "attention", "norm", "activation", "position", "ffn", "data")


def _job(tmp_path: Path, *overrides: str) -> tuple[dict, dict, list[str], Path]:
    """What the CLI hands ``run_job`` for these overrides, with files under tmp_path."""
    overrides = (*TINY_RUN, f"paths.results_dir={tmp_path / 'results'}", *overrides)
    config = compose_config(*overrides)
    return config, {g: config[g]["name"] for g in CHOICES}, list(overrides), tmp_path / "run"


def _records(folder: Path) -> dict[str, dict]:
    return {path.name: records.load(path) for path in sorted(folder.glob("*.json"))}


@pytest.mark.slow  # a whole sweep in a subprocess: make test-full
def test_an_experiment_declares_its_sweep_and_the_command_line_still_overrides_it(tmp_path):
    result = _xbench("-m", "experiment=smoke", "seed=7", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    done = _records(tmp_path / "results" / "smoke").values()
    assert sorted(r["choices"]["activation"] for r in done) == ["gelu", "relu"]  # from smoke.yaml
    assert {r["seed"] for r in done} == {7}  # the command line replaced smoke.yaml's seed: 0,1
    assert {r["status"] for r in done} == {"finished"}
    assert {r["config"]["model"]["d_model"] for r in done} == {32}


def test_a_diverging_job_does_not_sink_the_sweep(tmp_path):
    result = _xbench("-m", "experiment=smoke", "seed=0", "activation=relu", "optim.lr=1e-3,1e30",
                     "trainer.gradient_clip_val=0", cwd=tmp_path)
    assert result.returncode == 1, result.stderr[-2000:]  # the sweep went on, then reported
    done = _records(tmp_path / "results" / "smoke")
    status = {r["config"]["optim"]["lr"]: r["status"] for r in done.values()}
    assert status == {1e-3: "finished", 1e30: "diverged"}
    [error] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    diverged = next(name for name, r in done.items() if r["status"] == "diverged")
    assert "training loss is nan" in error
    assert f"recorded as diverged: results/smoke/{diverged}" in error
    summary = result.stderr[result.stderr.index("[xbench] sweep:"):]
    assert "2 of 2 jobs" in summary and "1 finished, 1 failed" in summary
    assert "job 2 failed: optim.lr=1e+30 -- training loss is nan" in summary


def test_a_failing_single_run_exits_non_zero_with_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        run_job(*_job(tmp_path, "optim.lr=1e30", "trainer.gradient_clip_val=0"), multirun=False)
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    [error] = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: training loss is nan") and "recorded as diverged" in error
    assert "Traceback" not in stderr


def test_any_exception_in_a_sweep_is_recorded_reported_and_logged(tmp_path, capsys,
                                                                  monkeypatch):
    import lightning

    def broken_test(*args, **kwargs):
        raise ValueError("the test split broke")

    monkeypatch.setattr(lightning.Trainer, "test", broken_test)  # after training: unexpected
    config, choices, overrides, run_dir = _job(tmp_path)
    assert run_job(config, choices, overrides, run_dir, multirun=True) is None  # sweep goes on
    [error] = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    [path] = (tmp_path / "results" / "default").glob("*.json")
    assert records.load(path)["status"] == "failed"
    assert error.startswith("error: ValueError: the test split broke")
    assert f"recorded as failed: {path}" in error and f"traceback: {run_dir / 'error.log'}" in error
    assert "Traceback (most recent call last)" in (run_dir / "error.log").read_text()


def test_skip_completed_skips_finished_runs_only(tmp_path, capsys):
    config, choices, overrides, run_dir = _job(tmp_path, "++skip_completed=true")
    run_job(config, choices, overrides, run_dir, multirun=False)
    [path] = (tmp_path / "results" / "default").glob("*.json")
    first = path.stat().st_mtime_ns
    capsys.readouterr()

    run_job(config, choices, overrides, tmp_path / "again", multirun=False)
    assert capsys.readouterr().out == f"[xbench] skip {path.stem}: already finished ({path})\n"
    assert path.stat().st_mtime_ns == first and not (tmp_path / "again").exists()

    records.write_json_atomic(path, records.load(path) | {"status": "diverged"})
    run_job(config, choices, overrides, tmp_path / "rerun", multirun=False)
    assert "already finished" not in capsys.readouterr().out
    rerun = records.load(path)
    assert rerun["status"] == "finished" and rerun["run_dir"] == str(tmp_path / "rerun")


@pytest.mark.slow
def test_an_interrupted_study_resumes_where_it_stopped(tmp_path):
    command = [*XBENCH, "-m", "experiment=smoke", "trainer.max_steps=32"]
    env = dict(os.environ, XBENCH_DATA_DIR=str(tmp_path / "data"))
    folder = tmp_path / "results" / "smoke"
    study = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL,  # Ctrl-C works as in a terminal even
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 120
    while len(list(folder.glob("*.json"))) < 2 and study.poll() is None:
        assert time.monotonic() < deadline, "the study wrote no second record in 120 s"
        time.sleep(0.02)
    study.send_signal(signal.SIGINT)  # Ctrl-C during the third job
    assert study.wait(timeout=60) != 0
    at_kill = _records(folder)
    before = {name: (folder / name).stat().st_mtime_ns for name, r in at_kill.items()
              if r["status"] == "finished"}
    assert 2 <= len(before) < 4
    assert {r["status"] for r in at_kill.values()} <= {"finished", "interrupted"}

    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    after = _records(folder)
    assert len(after) == 4 and {r["status"] for r in after.values()} == {"finished"}
    assert {(r["choices"]["activation"], r["seed"]) for r in after.values()} == {
        ("relu", 0), ("relu", 1), ("gelu", 0), ("gelu", 1)}
    assert {name: (folder / name).stat().st_mtime_ns for name in before} == before
    skipped = {line.split()[2].rstrip(":") for line in result.stdout.splitlines()
               if line.startswith("[xbench] skip")}
    assert skipped == {Path(name).stem for name in before}
