"""When a run validates: ``trainer.val_checks`` times, evenly spaced, the last at ``max_steps``.

The i-th of n validations (i = 1..n) follows optimizer step ``ceil(i * max_steps / n)``: for
300 steps and 8 checks 38, 75, 113, 150, 188, 225, 263, 300 -- the first at 1/8 of training or
just after it, the last at the end, so a record's ``final`` is the trained model's.  A run of
fewer steps than checks validates after every step (7 steps, 8 checks: 1, ..., 7).

Lightning validates every ``val_check_interval`` batches: multiples of one interval, which end
before ``max_steps`` unless the interval divides it (300 / 8 at ceil(37.5) = 38: the last at
266).  :func:`validate_after` instead replaces the fit loop's decision after each training batch
(``_TrainingEpochLoop._should_check_val_fx``, Lightning 2.x; asked again on resume to place the
restored batch) by "this batch stepped the optimizer and the step is scheduled": a set lookup
per batch, and the validation loop is entered only at scheduled steps, so every validation hook
(history, resume points, throughput's clock, loggers, checkpoints) sees exactly those;
Lightning's other triggers (early stopping, time intervals: unused here) are dropped.  Not
chosen: a callback (Lightning has no hook that starts or skips a validation), a validation
interval of one step with a gate (the validation loop entered at every step), a validation
after ``fit`` (outside the fit loop: its checkpoints, its resume).
"""

from __future__ import annotations

from collections.abc import Iterable

import lightning as L


def validation_steps(max_steps: int, val_checks: int) -> list[int]:
    """The optimizer steps that are followed by a validation, ascending; the last is
    ``max_steps``."""
    checks = max(val_checks, 1)
    return sorted({-(-i * max_steps // checks) for i in range(1, checks + 1)})


def validate_after(trainer: L.Trainer, steps: Iterable[int]) -> None:
    """Make ``trainer`` validate after exactly the optimizer steps ``steps`` (see the module
    docstring), whatever its ``val_check_interval``; ``limit_val_batches=0`` still disables
    validation."""
    loop = trainer.fit_loop.epoch_loop
    if not callable(getattr(loop, "_should_check_val_fx", None)):
        raise RuntimeError(f"lightning {L.__version__}'s fit loop has no _should_check_val_fx "
                           "to replace: port validation_schedule.validate_after to it")
    scheduled = frozenset(steps)

    def scheduled_now(data_fetcher) -> bool:
        # not accumulating: the batch just done stepped the optimizer (to global_step)
        return (loop._should_check_val_epoch() and not loop._should_accumulate()
                and trainer.global_step in scheduled)

    loop._should_check_val_fx = scheduled_now
