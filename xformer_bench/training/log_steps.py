"""Whether a training metric logged now reaches anyone: the progress bar (every step, when
shown) or a logger (every ``trainer.log_every_n_steps`` steps).  Each ``LightningModule.log``
call costs about a millisecond on a CPU (Lightning moves its result collection to the device),
so a study with no progress bar logs its per-step metrics only on the steps that are written.

A metric logged for the progress bar (``prog_bar=True``) is converted to a Python number at the
end of every training batch, whether the bar is shown or not -- on a GPU the host waits for the
step there (tests/test_host_sync.py) -- so training metrics are logged for the bar only while a
bar is shown (:func:`shows_progress`).
"""

from __future__ import annotations


def logs_this_step(trainer) -> bool:
    """True when this training step's logged metrics are shown or written."""
    if trainer is None or trainer.progress_bar_callback is not None:
        return True
    connector = getattr(trainer, "_logger_connector", None)  # Lightning's own schedule
    return True if connector is None else bool(connector.should_update_logs)


def shows_progress(trainer) -> bool:
    """True when a progress bar is shown: the value of ``prog_bar`` for a per-step metric."""
    return trainer is None or trainer.progress_bar_callback is not None
