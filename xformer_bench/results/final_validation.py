"""Where a table's "final" loss was measured, read from its records, for the caption.

A record's ``final`` is its last validation.  Runs validate last at
``trainer.max_steps`` and store that step (``final_step``); older runs validated every
``ceil(max_steps / val_checks)`` steps, so their last validation could come before the end
(300 steps, 8 checks: step 266).  Their step is the one ``final`` carries, else the last
``history`` point's.
"""

from __future__ import annotations

from typing import Any

UNKNOWN = "the last validation"
"""The caption's words when no finished record says where its final validation was."""


def final_step(record: dict[str, Any]) -> int | None:
    """The optimizer step of ``record``'s final validation; None when it has none."""
    if record.get("final_step") is not None:
        return int(record["final_step"])
    history = record.get("history") or [{}]
    step = (record.get("final") or history[-1]).get("step")
    return None if step is None else int(step)


def _max_steps(record: dict[str, Any]) -> int | None:
    trainer = (record.get("config") or {}).get("trainer") or {}
    return trainer.get("max_steps", record.get("steps"))


def final_at(records: list[dict[str, Any]]) -> str:
    """Where the finished records' final validation was, after "at": ``the last step (300)``
    when each was at its ``max_steps``, else each (step, max_steps) found: ``step 266 of 300
    (the last validation)``."""
    found = sorted({(step, _max_steps(r)) for r in records if r.get("status") == "finished"
                    and (step := final_step(r)) is not None})
    if not found:
        return UNKNOWN
    if all(step == end for step, end in found):
        return f"the last step ({', '.join(str(end) for _, end in found)})"
    return (", ".join(f"step {step} of {end}" for step, end in found)
            + " (the last validation)")
