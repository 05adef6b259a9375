"""Two sweeps writing one ``results/`` at once: every run trained once, recorded once."""

from __future__ import annotations

import os
import socket
import subprocess

import pytest

from conftest import XBENCH
from xformer_bench.results.collect import collect
from xformer_bench.parallel_sweep import ENVIRONMENT
from xformer_bench.run_claim import claim_path, claimed, held_by_sibling, holder_of


def test_a_live_claim_is_respected_and_a_dead_ones_is_taken_over(tmp_path):
    record = tmp_path / "exp" / "run.json"
    with claimed(record) as first:
        assert first and holder_of(record) == f"{socket.gethostname()}:{os.getpid()}"
        with claimed(record) as second:
            assert not second  # this process holds it: a second claimant skips
    assert not claim_path(record).exists() and holder_of(record) is None
    assert not record.parent.exists()  # the folder made for the claim goes with it

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer exists
    record.parent.mkdir()
    claim_path(record).write_text(f"{socket.gethostname()} {gone.pid}\n")
    with claimed(record) as taken:
        assert taken  # a killed process's claim does not block the run forever


def test_a_claim_held_by_another_worker_of_the_same_sweep_is_told_apart(tmp_path, monkeypatch):
    """A ``--workers`` sibling (same parent) is no stranger: its skips are not listed as runs
    held elsewhere, with a command to clear them."""
    record = tmp_path / "exp" / "run.json"
    record.parent.mkdir()
    sibling = subprocess.Popen(["sleep", "30"])  # its parent: this process
    try:
        claim_path(record).write_text(f"{socket.gethostname()} {sibling.pid} now\n")
        monkeypatch.setenv(ENVIRONMENT, "2")
        monkeypatch.setattr(os, "getppid", os.getpid)  # as if this process were its sibling
        assert held_by_sibling(record)
        monkeypatch.delenv(ENVIRONMENT)
        assert not held_by_sibling(record)  # not a worker: a sweep started beside another
        monkeypatch.setenv(ENVIRONMENT, "2")
        claim_path(record).write_text(f"{socket.gethostname()} 1 now\n")  # init: other parent
        assert not held_by_sibling(record)
    finally:
        sibling.kill()
        sibling.wait()


@pytest.mark.slow  # a whole sweep in a subprocess: make test-full
def test_two_sweeps_at_once_train_each_run_once(tmp_path):
    env = dict(os.environ, XBENCH_DATA_DIR=str(tmp_path / "data"))
    command = [*XBENCH, "-m", "experiment=smoke", "hydra.sweep.dir=multirun/${now:%H%M%S%f}"]
    sweeps = [subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [sweep.communicate(timeout=300) for sweep in sweeps]
    assert all(sweep.returncode == 0 for sweep in sweeps), outputs[0][1][-2000:]
    trained = [line for out, _ in outputs for line in out.splitlines()
               if line.startswith("[xbench] record:")]
    skipped = [line for out, _ in outputs for line in out.splitlines()
               if line.startswith("[xbench] skip")]
    assert len(trained) == 4 and len(skipped) == 4  # each of the 4 runs: once each way
    found = collect(tmp_path / "results")
    assert len(found.of("smoke")) == 4 and not found.duplicates
    assert {r["status"] for r in found.of("smoke")} == {"finished"}
    assert not list((tmp_path / "results").rglob("*.claim"))
