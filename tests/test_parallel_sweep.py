"""``xbench -m ... --workers N``: a sweep shared by N processes, each on its share of the cores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from conftest import XBENCH
from xformer_bench.errors import ConfigError
from xformer_bench.parallel_sweep import core_shares, split_workers, worker_command, worst
from xformer_bench.results.collect import collect


def test_the_flag_is_read_in_either_spelling_and_removed():
    assert split_workers(["-m", "--workers", "2", "seed=0,1"]) == (2, ["-m", "seed=0,1"])
    assert split_workers(["-m", "--workers=3"]) == (3, ["-m"])
    assert split_workers(["-m", "seed=0"]) == (None, ["-m", "seed=0"])
    for bad in (["--workers"], ["--workers", "0"], ["--workers=two"]):
        with pytest.raises(ConfigError, match="--workers takes a number"):
            split_workers(bad)


def test_cores_are_split_contiguously_and_shared_when_too_few():
    assert core_shares([0, 1], 2) == [[0], [1]]
    assert core_shares([0, 1, 2, 3, 4], 2) == [[0, 1, 2], [3, 4]]
    assert core_shares([0, 1], 3) == [[0], [1], [0]]
    assert core_shares([0, 1, 2, 3], 1) == [[0, 1, 2, 3]]


def test_a_worker_skips_what_another_finished_and_keeps_its_own_folders():
    command = worker_command(["-m", "experiment=smoke", "skip_completed=false",
                              "trainer.progress_bar=true"], 2)
    assert command[:3] == [sys.executable, "-m", "xformer_bench.cli"]
    assert "skip_completed=false" not in command and "skip_completed=true" in command
    assert "trainer.progress_bar=true" not in command and "trainer.progress_bar=false" in command
    assert command[-1] == "hydra.sweep.dir=multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}/w2"
    assert worker_command(["-m", "hydra.sweep.dir=out"], 1)[-1] == "hydra.sweep.dir=out/w1"


def test_the_worst_status_wins():
    assert worst([0, 0]) == 0
    assert worst([0, 1]) == 1
    assert worst([1, 2]) == 2
    assert worst([0, -9]) == 2  # a worker killed by a signal: interrupted


def test_workers_need_a_sweep(tmp_path):
    done = subprocess.run([*XBENCH, "--workers", "2", "seed=0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: --workers shares a sweep's jobs among processes: add -m")


@pytest.mark.slow  # two worker processes: make test-full
def test_two_workers_train_each_run_once_on_their_own_cores(tmp_path):
    env = dict(os.environ, XBENCH_DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run([*XBENCH, "-m", "experiment=smoke", "--workers", "2"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    trained = [line for line in lines if "] [xbench] record:" in line]
    assert len(trained) == 4  # 4 runs, each trained by one worker
    assert {line.split()[0] for line in trained} <= {"[w1]", "[w2]"}
    found = collect(tmp_path / "results")
    assert len(found.of("smoke")) == 4 and not found.duplicates
    assert {r["timing_conditions"]["parallel_jobs"] for r in found.of("smoke")} == {2}
    assert not any(r["timing_conditions"]["alone"] for r in found.of("smoke"))
    assert "workers ended: w1 exit 0, w2 exit 0" in lines[-1]



@pytest.mark.slow
def test_a_signal_to_the_sweep_reaches_every_worker_and_each_records_its_run(tmp_path):
    """``timeout``/``scancel`` signal the sweep's own process: each worker must stop its run
    as interrupted (a resume point kept), not train on as an orphan."""
    env = dict(os.environ, XBENCH_DATA_DIR=str(tmp_path / "data"))
    sweep = subprocess.Popen([*XBENCH, "-m", "experiment=smoke", "trainer.max_steps=100000",
                              "trainer.checkpoint_every=1", "--workers", "2"], cwd=tmp_path,
                             env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(sweep.stdout), daemon=True)
    reader.start()
    deadline = time.monotonic() + 240
    while len({p.parent for p in tmp_path.glob("results/checkpoints/smoke/*/step-*.ckpt")}) < 2:
        assert sweep.poll() is None and time.monotonic() < deadline, "".join(lines[-30:])
        time.sleep(0.2)  # both workers are training (each has written a resume point)
    sweep.send_signal(signal.SIGTERM)
    assert sweep.wait(timeout=120) == 2
    reader.join(timeout=10)
    found = collect(tmp_path / "results").of("smoke")
    assert len(found) == 2 and {r["status"] for r in found} == {"interrupted"}, "".join(lines)
    assert "workers ended: w1 exit 2, w2 exit 2" in lines[-1]
