"""Progress without a progress bar: in a log file, a batch job or a ``--workers`` sweep
(``trainer.progress_bar`` off, or ``auto`` with no terminal) each validation prints one line --
the step, the validation metric, the time so far and an estimate of the time left -- so a log
shows how far every run is."""

from __future__ import annotations

import sys
import time

import lightning as L

from xformer_bench.sweep_report import clock


def shows_bar(setting: bool | str) -> bool:
    """``trainer.progress_bar``: true, false, or auto (a bar when stderr is a terminal)."""
    if setting == "auto":
        return sys.stderr.isatty()
    return bool(setting)


class ProgressLines(L.Callback):
    """One ``[xbench]`` line per validation while no progress bar is shown (rank 0 only)."""

    def __init__(self, run_id: str, max_steps: int, metric_key: str):
        self.run_id, self.max_steps, self.metric_key = run_id, max_steps, metric_key
        self.started: tuple[float, int] | None = None  # (time, step) when training began

    def on_train_start(self, trainer, pl_module) -> None:
        self.started = (time.monotonic(), trainer.global_step)  # a resumed run: from its step

    def on_validation_end(self, trainer, pl_module) -> None:
        if (trainer.sanity_checking or trainer.global_rank != 0 or self.started is None
                or trainer.progress_bar_callback is not None):
            return
        step, (began, first) = trainer.global_step, self.started
        elapsed = time.monotonic() - began
        value = trainer.callback_metrics.get(self.metric_key)
        split, _, name = self.metric_key.partition("/")
        shown = f"{split} {name} {float(value):.4f}" if value is not None else "validated"
        left = (f", ~{clock(elapsed / (step - first) * (self.max_steps - step))} left"
                if first < step < self.max_steps else "")
        print(f"[xbench] {self.run_id}: step {step}/{self.max_steps}: {shown} "
              f"({clock(elapsed)}{left})", flush=True)
