"""A signal under DDP stops every rank at the same step, saved and recorded
(:mod:`xformer_bench.training.preemption`).  Before, Lightning's SIGTERM handler broadcast
inside the handler: a rank signalled twice (its process group, then rank 0 forwarding) waited
forever, and ranks that saw the signal at different steps parted -- the run hung with no
record and no resume point."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import XBENCH
from xformer_bench.training.preemption import Preemption


CASES = [([int(signal.SIGTERM), None], int(signal.SIGTERM)),  # rank 0 only: rank 1 stops too
         ([None, int(signal.SIGUSR1)], int(signal.SIGUSR1)),  # rank 1 only: rank 0 stops too
         ([None, None], None)]


def _agree(rank: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        agreed = []
        for received, _ in CASES:
            callback = Preemption(save=None, validates_at=None)
            callback.received = received[rank]
            agreed.append(callback._agreed(SimpleNamespace(world_size=2)))
        Path(out, f"rank{rank}").write_text(json.dumps(agreed))
    finally:
        dist.destroy_process_group()


def test_the_ranks_agree_on_a_signal_any_one_of_them_received(tmp_path):
    """Two gloo ranks in one spawn (each case costs one all-reduce, the spawn seconds)."""
    mp.spawn(_agree, args=(f"file://{tmp_path / 'rendezvous'}", str(tmp_path)), nprocs=2,
             join=True)
    expected = [agreed for _, agreed in CASES]
    assert [json.loads((tmp_path / f"rank{r}").read_text()) for r in (0, 1)] == [expected] * 2


def test_lightnings_handler_is_replaced_when_training_starts():
    """Lightning composes its SIGTERM handler with ours after fit start; ours alone remains."""
    callback = Preemption(save=None, validates_at=None)
    trainer = SimpleNamespace(world_size=1)
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    try:
        callback.on_fit_start(trainer, None)
        signal.signal(signal.SIGTERM, lambda *args: None)  # what Lightning registers
        callback.on_train_start(trainer, None)
        assert signal.getsignal(signal.SIGTERM) == callback._handle
    finally:
        callback.teardown(trainer, None, "fit")
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@pytest.mark.slow  # two DDP ranks in subprocesses: make test-full
def test_a_ddp_run_signalled_twice_stops_saved_and_recorded(tmp_path):
    """SIGTERM to the whole process group (as ``timeout`` and ``scancel`` send it): rank 1
    gets it twice.  The run ends within a minute as interrupted, with a resume point."""
    command = [*XBENCH, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2",
               "trainer.max_steps=100000", "trainer.val_checks=2", "logger=none",
               "trainer.progress_bar=false", f"paths.results_dir={tmp_path}/results"]
    log = tmp_path / "out.log"
    with log.open("w") as out:
        run = subprocess.Popen(command, cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT,
                               start_new_session=True)
        points = tmp_path / "results" / "checkpoints"
        deadline = time.monotonic() + 240
        while "GLOBAL_RANK: 1" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(1)
        time.sleep(10)  # into training on both ranks
        os.killpg(run.pid, signal.SIGTERM)
        try:
            status = run.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(run.pid, signal.SIGKILL)
            pytest.fail("the DDP run hung after SIGTERM:\n" + log.read_text()[-2000:])
    assert status == 2, log.read_text()[-2000:]
    [record] = (tmp_path / "results" / "default").glob("*.json")
    assert json.loads(record.read_text())["status"] == "interrupted"
    assert list(points.rglob("step-*.ckpt")), "no resume point"
    assert "Traceback" not in log.read_text()
