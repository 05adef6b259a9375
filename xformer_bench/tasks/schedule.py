"""Learning-rate schedules: linear warm-up, then a configurable decay."""

from __future__ import annotations

import math

DECAYS = ("cosine", "linear", "constant", "inverse_sqrt")


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, decay: str,
              min_lr_ratio: float) -> float:
    """Multiplier of the peak learning rate at optimizer step ``step``."""
    if decay not in DECAYS:
        raise ValueError(f"optim.decay={decay!r}; choose one of {DECAYS}")
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if decay == "constant":
        return 1.0
    if decay == "inverse_sqrt":
        return math.sqrt(max(warmup_steps, 1) / (step + 1))
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    shape = 0.5 * (1 + math.cos(math.pi * progress)) if decay == "cosine" else 1 - progress
    return min_lr_ratio + (1 - min_lr_ratio) * shape
