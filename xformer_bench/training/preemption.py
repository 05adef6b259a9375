"""Stop cleanly when asked to: pre-emption, ``scancel``, Ctrl-C.

SIGTERM, SIGUSR1 (SLURM's pre-emption warning, ``--signal=USR1@90``) and a first SIGINT let the
current training step finish, save a resume point, and end the run with status
``interrupted`` (:class:`RunInterrupted`); a second Ctrl-C stops at
once.  Under SLURM (``SLURM_JOB_ID`` set) the job is then requeued with ``scontrol requeue``:
it starts again and continues from that point (``resume=auto``).  A signal during a
validation, or in the step before one, stops without a new point (one saved before a
validation would resume after it): the run continues from its last resume point and runs
that validation again, whole.

Outside training (data, model, the record, between a sweep's jobs) SIGTERM and SIGUSR1 are held,
not fatal (:mod:`~xformer_bench.training.held_signals`): a run being set up stops as interrupted
before its first step, and no later job of the sweep starts.

Under DDP every rank stops at the same step: a handler only notes the signal, and at each
step's end (and each validation batch's) the ranks agree on whether any received one (a MAX
all-reduce of the signal number over a CPU (gloo) group: no device synchronisation).
Lightning's own SIGTERM handler is replaced once training starts: it broadcasts inside the
handler, so a rank signalled twice (by its process group and by rank 0 forwarding it) waited
forever on a broadcast no other rank made, and ranks signalled at different steps parted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist

from xformer_bench.errors import XbenchError
from xformer_bench.training.held_signals import held_signal

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


class RunInterrupted(XbenchError):
    """The run stopped on a signal; its record says ``interrupted`` and where it resumes."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None, requeued: bool,
                 auto: bool = True):
        self.signal_name, self.step, self.checkpoint = signal_name, step, checkpoint
        saved = (f"resume point {checkpoint}" if checkpoint is not None
                 else "its last resume point")
        then = ("the job was requeued" if requeued else
                "run the same command to resume" if auto else
                "run the same command with resume=auto to resume")
        super().__init__(f"{signal_name} at step {step}: stopped with {saved}; {then}")


def requeue_slurm_job(log: Callable[[str], None] = print) -> bool:
    """``scontrol requeue $SLURM_JOB_ID`` when inside a SLURM job; True when it was accepted."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") and (
        f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}")
    job = job or os.environ.get("SLURM_JOB_ID")
    if not job:
        return False
    try:
        result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True,
                                timeout=60)
    except (OSError, subprocess.SubprocessError) as error:
        log(f"[xbench] could not requeue SLURM job {job}: {error}")
        return False
    if result.returncode != 0:
        log(f"[xbench] could not requeue SLURM job {job}: {result.stderr.strip()}")
        return False
    log(f"[xbench] requeued SLURM job {job}")
    return True


class Preemption(L.Callback):
    """Turns the signals of the module docstring into a saved, recorded stop."""

    def __init__(self, save: Callable[[L.Trainer], Path],
                 validates_at: Callable[[int], bool], auto: bool = True):
        self.save, self.validates_at, self.auto = save, validates_at, auto
        self.received: int | None = None
        self._previous: dict[int, object] = {}
        self._group = None  # the ranks' CPU group for agreeing on a stop (DDP only)

    def on_fit_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for signum in SIGNALS:
            self._previous[signum] = signal.getsignal(signum)
            signal.signal(signum, self._handle)
        self.received = held_signal()  # one that came while the run was being set up

    def on_train_start(self, trainer, pl_module) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum in SIGNALS:  # Lightning composed its handler with ours since fit start
                signal.signal(signum, self._handle)
        if self._distributed(trainer) and dist.get_backend() != "gloo":
            self._group = dist.new_group(backend="gloo")  # every rank, here, in step
        if self._agreed(trainer) is not None:  # stop before the first step: nothing to save
            self._stop(trainer, None)

    @staticmethod
    def _distributed(trainer) -> bool:
        return trainer.world_size > 1 and dist.is_available() and dist.is_initialized()

    def _agreed(self, trainer) -> int | None:
        """The signal any rank received, the same answer on every rank (one process: its own)."""
        if not self._distributed(trainer):
            return self.received
        flag = torch.tensor([self.received or 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        self.received = int(flag.item()) or None
        return self.received

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.received is not None:
            raise KeyboardInterrupt  # the second Ctrl-C: now
        self.received = signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches or self._agreed(trainer) is None:
            return
        # Before a validation, stop without a point: one saved here would resume after it.
        self._stop(trainer, None if self.validates_at(trainer.global_step) else self.save(trainer))

    def on_validation_batch_end(self, trainer, pl_module, *args) -> None:
        if not trainer.sanity_checking and self._agreed(trainer) is not None:
            self._stop(trainer, None)

    def _stop(self, trainer, path: Path | None) -> None:
        """Requeue under SLURM (not on Ctrl-C) and end the run as interrupted."""
        requeued = self.received != signal.SIGINT and requeue_slurm_job()
        raise RunInterrupted(signal.Signals(self.received).name, trainer.global_step, path,
                             requeued, self.auto)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()
