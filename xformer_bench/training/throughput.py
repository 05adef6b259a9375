"""Training throughput: optimizer steps per second and tokens per second.

Only training time counts: the intervals that contain a validation are left out, and so is
the first step (graph warm-up, allocator growth).  The time spent validating is summed too:
the record's ``validation_seconds`` (its share of the wall time is what whole-split
evaluation costs a run).  Tokens are counted over all ranks:
``tokens_per_step`` is one process's share, multiplied by the world size at fit start.
"""

from __future__ import annotations

import os
import time
from collections import deque
from pathlib import Path

import lightning as L

from xformer_bench.training.log_steps import logs_this_step, shows_progress


class Throughput(L.Callback):
    def __init__(self, tokens_per_step: int, window: int = 20):
        self.tokens_per_step = tokens_per_step
        self.world_size = 1
        self.recent: deque[float] = deque(maxlen=window)
        self.train_seconds = 0.0
        self.timed_steps = 0
        self.validation_seconds = 0.0  # wall time inside validations (the record's share)
        self.first_step_at: float | None = None  # wall clock (time.time) of this process's first step
        self.last_step_at: float | None = None  # ... and the end of its last one so far
        self._last: float | None = None
        self._validating_since: float | None = None
        self._warm = False

    @property
    def steps_per_sec(self) -> float:
        return self.timed_steps / self.train_seconds if self.train_seconds else float("nan")

    @property
    def tokens_per_sec(self) -> float:
        return self.steps_per_sec * self.tokens_per_step * self.world_size

    def state_dict(self) -> dict:
        """Kept in checkpoints: a resumed run's rate is over every step it timed."""
        return {"train_seconds": self.train_seconds, "timed_steps": self.timed_steps,
                "validation_seconds": self.validation_seconds}

    def load_state_dict(self, state: dict) -> None:
        self.train_seconds, self.timed_steps = state["train_seconds"], state["timed_steps"]
        self.validation_seconds = state.get("validation_seconds", 0.0)

    def on_fit_start(self, trainer, pl_module) -> None:
        self.world_size = trainer.world_size

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.first_step_at is None:
            self.first_step_at = time.time()
        if self._last is None:
            self._last = time.perf_counter()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches:
            return
        now = time.perf_counter()
        elapsed, self._last = now - self._last, now
        self.last_step_at = time.time()
        if not self._warm:
            self._warm = True
            return
        self.recent.append(elapsed)
        self.train_seconds += elapsed
        self.timed_steps += 1
        if logs_this_step(trainer):
            rate = len(self.recent) / sum(self.recent)
            pl_module.log("train/steps_per_sec", rate, prog_bar=shows_progress(trainer))
            pl_module.log("train/tokens_per_sec", rate * self.tokens_per_step * self.world_size)

    def on_validation_start(self, trainer, pl_module) -> None:
        self._last = None  # restart the clock at the next training batch
        if not trainer.sanity_checking:
            self._validating_since = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        if self._validating_since is not None:
            self.validation_seconds += time.perf_counter() - self._validating_since
            self._validating_since = None


def process_started_at() -> float | None:
    """Wall-clock time this process started (Linux ``/proc``), else None: the origin of the
    record's ``startup_seconds`` -- interpreter, imports, composition, data and model."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
