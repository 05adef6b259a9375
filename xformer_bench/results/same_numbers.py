"""Rows whose runs gave bit-identical numbers: configurations that differ, yet computed the same
thing at this setting (a local window at least as long as the sequence is full attention; a
Longformer without global tokens is a local window).  Every shared seed's validation and test
metrics equal to the last bit is no coincidence of training: a reader must read such rows as one
model, not as a tie between two methods.

The configuration-level check (:mod:`xformer_bench.results.same_computation`) names rows equal
by construction before they run; this one names what only the runs show.  Rows it already named
are left out here.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from xformer_bench.results.same_computation import equated, same_computation

MIN_SEEDS = 2
"""Seeds both rows finished before equal numbers count: one equal run could be chance."""


def _numbers(record: dict[str, Any]) -> str | None:
    """A finished run's final validation and test metrics, canonical; None without a test."""
    if record.get("status") != "finished" or not record.get("test"):
        return None
    return json.dumps([record.get("final"), record["test"]], sort_keys=True)


def same_numbers(variants: Sequence) -> list[list]:
    """Groups of two or more variants (in table order) that finished at least
    :data:`MIN_SEEDS` seeds each, with the same seeds, and equal numbers in every one."""
    named = {id(v) for group in same_computation(variants) for v in group}
    groups: dict[tuple, list] = {}
    for variant in variants:
        if id(variant) in named:
            continue
        per_seed = {str(r.get("seed")): _numbers(r) for r in variant.records}
        if len(per_seed) != len(variant.records) or None in per_seed.values():
            continue  # a seed run twice, or a seed that did not finish: no clean comparison
        if len(per_seed) >= MIN_SEEDS:
            groups.setdefault(tuple(sorted(per_seed.items())), []).append(variant)
    return [members for members in groups.values() if len(members) > 1]


def summary_line(variants: Sequence) -> str | None:
    """One line naming the rows with bit-identical numbers, or None when there are none."""
    groups = same_numbers(variants)
    return (f"Bit-identical numbers in every seed (their configurations differ, but at this "
            f"setting they computed the same thing: one model, not a tie): {equated(groups)}."
            if groups else None)
