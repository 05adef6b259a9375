"""SIGTERM and SIGUSR1 held, not fatal, outside training: from the process's start (the data,
the model, the record, between a sweep's jobs) a signal is remembered, so a run being set up
stops as interrupted before its first step and no later job of the sweep starts.  Training
itself stops on them at a step's end (:mod:`xformer_bench.training.preemption`).

Its own module, free of torch and Lightning: ``xbench`` installs the handlers first thing, and
``xbench --help`` or a one-line ``error:`` should not wait for those imports.
"""

from __future__ import annotations

import signal
import threading

HELD = (signal.SIGTERM, signal.SIGUSR1)
_held: int | None = None


def hold_signals() -> None:
    """From the process's start: remember SIGTERM/SIGUSR1 instead of dying of them, so a signal
    during a job's set-up or between jobs still ends in a record and a clean stop."""
    if threading.current_thread() is threading.main_thread():
        for signum in HELD:
            signal.signal(signum, _hold)


def _hold(signum: int, frame) -> None:
    global _held
    _held = signum


def held_signal() -> int | None:
    """The signal that arrived outside a run's training, if any (:func:`hold_signals`)."""
    return _held


def release_held_signal() -> None:
    """Forget a held signal (a test's clean slate)."""
    global _held
    _held = None
