"""Every validation's metrics with the optimizer step it happened at (kept in checkpoints, so
a resumed run's history is the whole run's)."""

from __future__ import annotations

import lightning as L


class ValidationHistory(L.Callback):
    def __init__(self, prefix: str = "val/"):
        self.prefix = prefix
        self.points: list[dict[str, float]] = []

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items()
                   if k.startswith(self.prefix)}
        if metrics:
            self.points.append({"step": trainer.global_step, **metrics})

    def state_dict(self) -> dict:
        return {"points": [dict(p) for p in self.points]}

    def load_state_dict(self, state: dict) -> None:
        self.points = [dict(p) for p in state["points"]]

    def at_fraction(self, fraction: float, max_steps: int) -> dict[str, float] | None:
        """The validation closest to ``fraction`` of training (1/8: the 'early' metric)."""
        if not self.points:
            return None
        return min(self.points, key=lambda p: abs(p["step"] - fraction * max_steps))
