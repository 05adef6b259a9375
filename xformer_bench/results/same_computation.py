"""Rows that differ only in what they name: two rows of a table whose runs compute the same thing
(their configurations are equal but for labels, the paper-row bundle that named them, and keys
their task never reads), so their difference is the noise between two runs of one model.

Narang et al.'s "Untied embeddings" and "Tied encoder/decoder input embeddings" are one model on
a decoder-only LM (it has no source table to tie): a reader must not read their gap as an effect.

Conservative by construction: keys whose values differ always separate two rows, even where a
part ignores them, except the ones the schema declares a task does not read
(:func:`~xformer_bench.schema.identity.unread_by`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xformer_bench.results.record import identity_config
from xformer_bench.schema.identity import unread_by

NAMING_ONLY = ("modification",)
"""Groups whose choice only names a bundle of other groups' choices (those count, in their own
groups)."""


def computation(record: dict[str, Any]) -> str:
    """What a run computes, as a canonical string: its identity config less the seed, every
    ``label``, the naming-only groups and the keys its task does not read."""
    essential = identity_config(record.get("config") or {})
    unread = unread_by(str(record.get("task") or "lm"))
    kept: dict[str, Any] = {}
    for name, node in essential.items():
        if name == "seed" or name in NAMING_ONLY:
            continue
        if isinstance(node, dict):
            node = {k: v for k, v in node.items()
                    if k != "label" and k not in unread.get(name, ())}
        kept[name] = node
    return json.dumps(kept, sort_keys=True, default=str)


def same_computation(variants: Sequence) -> list[list]:
    """Groups of two or more variants (in table order) whose runs compute the same thing: for
    every seed both ran, the same :func:`computation` (each variant one computation per seed)."""
    def signature(variant) -> tuple | None:
        per_seed = {}
        for record in variant.records:
            per_seed.setdefault(str(record.get("seed")), set()).add(computation(record))
        if any(len(found) != 1 for found in per_seed.values()):
            return None  # a row mixing configurations is another warning's business
        return tuple(sorted((seed, found.pop()) for seed, found in per_seed.items()))

    groups: dict[tuple, list] = {}
    for variant in variants:
        key = signature(variant)
        if key is not None:
            groups.setdefault(key, []).append(variant)
    return [members for members in groups.values() if len(members) > 1]


def equated(groups: Sequence[Sequence]) -> str:
    """``A = B; C = D``: the rows of each group, by label."""
    return "; ".join(" = ".join(v.label for v in members) for members in groups)


def summary_line(variants: Sequence) -> str | None:
    """One line naming the rows that are one computation, or None when there are none."""
    groups = same_computation(variants)
    return (f"One model under two names (configurations equal but for labels and keys this "
            f"task does not read: any gap between them is run-to-run noise): {equated(groups)}."
            if groups else None)


@dataclass(frozen=True)
class PlannedRow:
    """A row before it runs (``--dry-run``): its label and its jobs as records would hold them."""

    label: str
    records: tuple[dict[str, Any], ...]


def planned_rows(jobs: Sequence[tuple[str, dict[str, Any], str]]) -> list[PlannedRow]:
    """``(label, resolved config, task)`` per job -> one row per label, in plan order."""
    rows: dict[str, list[dict[str, Any]]] = {}
    for label, config, task in jobs:
        rows.setdefault(label, []).append({"config": config, "task": task,
                                           "seed": config.get("seed")})
    return [PlannedRow(label, tuple(records)) for label, records in rows.items()]
