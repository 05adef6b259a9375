"""Intermediate validations on a fixed subsample, the last one on the whole split.

``data.val_subsample`` (null: the whole split every time) is the number of evaluation batches
scored at each validation before the last: always the split's first ``n`` batches, the same
examples at every validation and in every run of the configuration (evaluation batches are
never shuffled), so a run's learning curve is comparable across its points and across rows.
The last validation -- the run's ``final`` metric -- and the test score the whole split, as the
evaluation protocol says.  What was scored is in the record (``val_subsample``).

Lightning's ``limit_val_batches`` is fixed for a whole fit; this callback sets the validation
loop's per-dataloader batch limit before each validation instead (after the step that
triggers it), which Lightning reads when the loop starts.  ``trainer.limit_val_batches``
still caps every validation, the last included.
"""

from __future__ import annotations

import lightning as L


class ValidationSubsample(L.Callback):
    def __init__(self, batches: int | None, last_validation: int):
        self.batches, self.last_validation = batches, last_validation  # the last's step
        self.whole: list[int | float] | None = None  # the loop's limits for the whole split
        self.scored: list[dict[str, int]] = []  # per validation: its step and batches scored

    def _loop(self, trainer):
        return trainer.fit_loop.epoch_loop.val_loop

    def on_train_start(self, trainer, pl_module) -> None:
        if self.batches is None:
            return
        loop = self._loop(trainer)
        loop.setup_data()  # what Lightning would do at the first validation: the split's size
        self.whole = list(loop._max_batches)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.whole is None:
            return
        final = trainer.global_step >= self.last_validation
        self._loop(trainer)._max_batches = list(self.whole) if final else [
            min(self.batches, whole) for whole in self.whole]

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        scored = self._loop(trainer).batch_progress.current.completed
        self.scored.append({"step": trainer.global_step, "batches": int(scored)})

    def report(self) -> dict[str, object] | None:
        """The record's ``val_subsample``: the subsample's size, the whole split's, and the
        batches each validation scored (null when every validation scores the whole split)."""
        if self.batches is None:
            return None
        whole = sum(self.whole) if self.whole else None
        return {"batches": self.batches, "whole_split_batches": whole, "scored": self.scored}

    def state_dict(self) -> dict:
        return {"scored": [dict(s) for s in self.scored]}

    def load_state_dict(self, state: dict) -> None:
        self.scored = [dict(s) for s in state["scored"]]
