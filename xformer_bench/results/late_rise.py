"""Rows whose last validation is well above an earlier one: their "final" number is not where
their training had them -- a late divergence, overfitting, or an evaluation artefact (Performer's
random features were once redrawn right before its final validation: its loss rose 30-80 %).
Named under the table with the steps, so a reader reads the curve before the number.

Read from each finished record's ``history``: its validation loss (``val/loss``, which every
task logs, lower is better).  A run has risen when its last validation loss is more than
:data:`RISE` above the lowest of its earlier ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

RISE = 0.05
"""How far above its lowest earlier validation loss a run's last one may end: 5 %.  Across the
shipped references no run without an artefact ends more than 2.1 % above it (a 300-step run)."""


class Rise(NamedTuple):
    last: float
    last_step: int
    lowest: float
    lowest_step: int


def late_rise(record: dict[str, Any]) -> Rise | None:
    """The run's last validation loss and its lowest earlier one, when the last is more than
    :data:`RISE` above it; else None (and for a run with fewer than two validations)."""
    points = sorted((int(point["step"]), float(point["val/loss"]))
                    for point in record.get("history") or []
                    if "val/loss" in point and point.get("step") is not None)
    if len(points) < 2:
        return None
    *earlier, (last_step, last) = points
    lowest_step, lowest = min(earlier, key=lambda point: point[1])
    return Rise(last, last_step, lowest, lowest_step) if last > lowest * (1 + RISE) else None


def summary_line(variants: Sequence) -> str | None:
    """One line naming the rows with a run that rose at the end (its worst seed), or None."""
    named = []
    for variant in variants:
        finished = [r for r in variant.records if r.get("status") == "finished"]
        rises = [rise for r in finished if (rise := late_rise(r)) is not None]
        if rises:
            worst = max(rises, key=lambda rise: rise.last / rise.lowest)
            named.append(f"{variant.label} ({len(rises)} of {len(finished)} runs; at most "
                         f"{worst.last:.3f} at step {worst.last_step} against "
                         f"{worst.lowest:.3f} at step {worst.lowest_step})")
    if not named:
        return None
    return (f"Rose at the end (last validation loss more than {RISE:.0%} above an earlier "
            f"one): {'; '.join(named)}: the final number is not where training had the "
            f"model; read its curve.")
