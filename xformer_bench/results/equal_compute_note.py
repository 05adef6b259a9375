"""The caption's sentence for a table whose rows were trained to an equal compute budget
(``equal_compute``, derived per row by :mod:`xformer_bench.training.equal_compute`)."""

from __future__ import annotations

from typing import Any

BUDGETS = ("tokens", "flops")


def equal_compute_sentence(variants: list[Any]) -> str | None:
    """The table's note when its records were trained to an equal compute budget: the budget
    and each row's derived max_steps; None when none was."""
    budgets, steps = set(), []
    for variant in variants:
        derived = set()
        for record in variant.records:
            request = (record.get("config") or {}).get("equal_compute")
            if not request or "result" not in request:
                continue
            kind = next(k for k in BUDGETS if k in request)
            budgets.add((kind, request[kind]))
            derived.add(request["result"]["max_steps"])
        if derived:
            steps.append(f"{variant.label} {'/'.join(str(s) for s in sorted(derived))}")
    if not budgets:
        return None
    budget = "; ".join(f"{value:,.4g} {kind}" if kind == "flops" else f"{int(value):,} {kind}"
                       for kind, value in sorted(budgets))
    return (f"equal compute: {budget} per row (max_steps derived per row: "
            f"{', '.join(steps)}).")
