"""A SIGTERM/SIGUSR1 that arrives while a job is being set up, or between a sweep's jobs, is held
(not fatal): the run stops as ``interrupted`` before its first step with a record, and no later
job of the sweep starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time

import pytest

import xformer_bench.run as run_module
from conftest import TINY_RUN, XBENCH, compose_config, run_tiny
from xformer_bench.config import choice_groups
from xformer_bench.job import run_job
from xformer_bench.training.held_signals import hold_signals, held_signal, release_held_signal
from xformer_bench.training.preemption import RunInterrupted


@pytest.fixture
def holding():
    """Signals held as in ``xbench``'s process; the handlers and the held signal restored."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1)}
    hold_signals()
    yield
    release_held_signal()
    for signum, handler in before.items():
        signal.signal(signum, handler)


def test_a_signal_while_the_run_is_set_up_is_recorded_before_the_first_step(
        tmp_path, monkeypatch, holding):
    build = run_module.build_task

    def build_then_signalled(config):
        built = build(config)
        os.kill(os.getpid(), signal.SIGTERM)  # the default action would end this process
        return built

    monkeypatch.setattr(run_module, "build_task", build_then_signalled)
    with pytest.raises(RunInterrupted, match="SIGTERM at step 0"):
        run_tiny(tmp_path)
    assert held_signal() == signal.SIGTERM
    [path] = (tmp_path / "results" / "default").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "interrupted" and record["history"] == []


def test_a_signal_held_since_an_earlier_job_stops_the_sweep_before_the_next(tmp_path, holding,
                                                                          capsys):
    os.kill(os.getpid(), signal.SIGUSR1)
    overrides = [*TINY_RUN, f"paths.results_dir={tmp_path / 'results'}"]
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    with pytest.raises(SystemExit) as stopped:
        run_job(config, choices, overrides, tmp_path / "run", multirun=True)
    assert stopped.value.code == 2
    assert "error: SIGUSR1 before this job started" in capsys.readouterr().err
    assert not (tmp_path / "results").exists() or not list((tmp_path / "results").rglob("*"))


@pytest.mark.slow
def test_a_sweep_signalled_as_its_first_job_starts_exits_2_with_one_error_line(tmp_path):
    """Before: the default action killed the process (exit -15) and left no record."""
    env = dict(os.environ, XBENCH_DATA_DIR=str(tmp_path / "data"))
    sweep = subprocess.Popen([*XBENCH, "-m", "experiment=smoke"], cwd=tmp_path,
                             env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: [lines.append(line) for line in sweep.stdout],
                              daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any("job 1/" in line for line in lines):
        assert sweep.poll() is None and time.monotonic() < deadline, "".join(lines)
        time.sleep(0.01)
    sweep.send_signal(signal.SIGTERM)  # during the first job's set-up
    stderr = sweep.stderr.read()
    assert sweep.wait(timeout=120) == 2, stderr
    reader.join(timeout=10)
    errors = [line for line in stderr.splitlines() if line.startswith("error: SIGTERM")]
    assert len(errors) == 1, stderr
    assert not any("job 2/" in line for line in lines)
