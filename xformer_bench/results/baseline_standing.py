"""Whether a study's baseline has learned, said under its table.

A comparison whose baseline is still at the n-gram level, or still falling fast, ranks how
quickly each row leaves the plateau rather than how good it becomes.  From the baseline row's
runs: its test metric placed between the corpus's n-gram floors (the records' ``ngram_floors``,
:mod:`xformer_bench.results.ngram_floors`) and how much its validation metric improved over the
last :data:`LAST_SHARE` of its steps (the validation curve, interpolated at the start of that
span).  The table is marked an **early-learning comparison** when the baseline is above the
:data:`EARLY_FLOOR`-gram floor or improved by more than the study's ``still_learning`` rate
(default :data:`STILL_LEARNING`, in the metric's unit) over that span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

LAST_SHARE = 0.2
"""The span of training whose improvement says whether the baseline still learns."""
EARLY_FLOOR = 3
"""A baseline above this order's n-gram floor has not learned past trigram statistics."""
STILL_LEARNING = 0.05
"""Default ``still_learning``: an improvement over the last :data:`LAST_SHARE` of the steps
above this (metric units, e.g. bits per byte) means the baseline is still learning fast."""
EARLY_LEARNING = "early-learning comparison"


@dataclass(frozen=True)
class Standing:
    sentence: str
    early: bool


def improvement(history: Sequence[dict[str, Any]], key: str, higher_is_better: bool,
                share: float = LAST_SHARE) -> tuple[float, int, int] | None:
    """(how much ``key`` improved over the last ``share`` of the validated steps, the span's
    first step, its last) from one run's validation history; None with fewer than two points.
    The value at the span's start is interpolated linearly between the validations around it."""
    points = [(int(h["step"]), float(h[key])) for h in history
              if isinstance(h.get(key), (int, float)) and math.isfinite(h[key])]
    if len(points) < 2:
        return None
    end_step, end = points[-1]
    start_step = max(points[0][0], round((1 - share) * end_step))
    start = _at(points, start_step)
    gained = end - start if higher_is_better else start - end
    return gained, start_step, end_step


def _at(points: list[tuple[int, float]], step: int) -> float:
    for (s0, v0), (s1, v1) in zip(points, points[1:]):
        if s0 <= step <= s1:
            return v0 + (v1 - v0) * (step - s0) / (s1 - s0) if s1 > s0 else v1
    return points[0][1] if step < points[0][0] else points[-1][1]


def floor_place(value: float, floors: dict[str, float]) -> tuple[str, int | None]:
    """Where ``value`` sits among the floors (``{"2": bits, ...}``): the words, and the lowest
    order whose floor it is above (None when below every floor)."""
    orders = sorted((int(k), v) for k, v in floors.items() if int(k) >= 2)
    above = next((order for order, bits in orders if value > bits), None)
    below = [(order, bits) for order, bits in orders if value <= bits]
    words = []
    if below:
        words.append(f"below the {below[-1][0]}-gram floor {below[-1][1]:.2f}")
    if above is not None:
        words.append(f"above the {above}-gram floor {dict(orders)[above]:.2f}")
    return ", ".join(words), above


def standing(runs: Sequence[dict[str, Any]], label: str) -> Standing | None:
    """The baseline row's standing from its finished ``runs`` (None without a primary metric
    measured on the test split)."""
    finished = [r for r in runs if r.get("status") == "finished"]
    spec = next((m for r in finished for m in r.get("metrics", [])
                 if m.get("name") == r.get("primary_metric")), None)
    if spec is None:
        return None
    name, higher = spec["name"], bool(spec.get("higher_is_better"))
    tests = [r["test"][f"test/{name}"] for r in finished
             if isinstance((r.get("test") or {}).get(f"test/{name}"), (int, float))]
    if not tests:
        return None
    value = sum(tests) / len(tests)
    parts, early_because = [f"test {name} {value:.3f}"], []
    floors = next((r["ngram_floors"].get("bits_per_byte") for r in finished
                   if isinstance(r.get("ngram_floors"), dict)), None)
    if floors and name == "bpb":
        words, above = floor_place(value, floors)
        parts[0] += f", {words}"
        if above is not None and above <= EARLY_FLOOR:
            early_because.append(f"above the {EARLY_FLOOR}-gram floor")
    gains = [g for g in (improvement(r.get("history") or [], f"val/{name}", higher)
                         for r in finished) if g is not None]
    if gains:
        gained = sum(g[0] for g in gains) / len(gains)
        rate = _declared_rate(finished)
        moved = f"improved {gained:.3f}" if gained >= 0 else f"worsened {-gained:.3f}"
        parts.append(f"over the last {LAST_SHARE:.0%} of its steps ({gains[0][1]}-{gains[0][2]}) "
                     f"validation {name} {moved}")
        if gained > rate:
            early_because.append(f"still improving by more than {rate:g} {name} over the last "
                                 f"{LAST_SHARE:.0%} of its steps")
    sentence = f"Baseline ({label}): {'; '.join(parts)}."
    if early_because:
        why = ("the rows rank how fast a model leaves the n-gram regime, not how good it becomes"
               if early_because[0].startswith("above") else
               "a row that learns more slowly may yet catch up: the ranks are this budget's")
        sentence += (f" An {EARLY_LEARNING}: the baseline is {' and '.join(early_because)}, so "
                     f"{why}.")
    return Standing(sentence, bool(early_because))


def _declared_rate(runs: Sequence[dict[str, Any]]) -> float:
    declared = next((r["config"].get("still_learning") for r in runs
                     if isinstance(r.get("config"), dict)), None)
    return float(declared) if isinstance(declared, (int, float)) else STILL_LEARNING
