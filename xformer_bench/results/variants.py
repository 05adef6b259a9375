"""Group an experiment's records into variants: the rows of its table.

A row is keyed by what VARIES across the experiment: the component groups (model, attention,
norm, activation, position, ffn, ...) whose choice differs between records, plus any other
override (``optim.lr=1e-3``) that differs, plus any setting the runs of one row on one dataset
still differ in (:mod:`~xformer_bench.results.setups`: ``trainer.max_steps``, ``data.path``),
so two configurations are never averaged as seeds.
The dataset is not part of the key: each dataset is a column, and what differs only between
datasets (their sizes, a preset per domain) is not either.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from xformer_bench.config import PLUMBING_GROUPS, group_order
from xformer_bench.hybrid_layout import hybrid_label
from xformer_bench.results.record import IDENTITY_EXCLUDED

# Overrides that never make a different variant: where files go, how it is logged, the seed.
NEUTRAL_OVERRIDE_ROOTS = ("seed", "experiment", "experiment_name", "hydra", *IDENTITY_EXCLUDED)
"""Override roots that never make a row of their own: the seed, the study and where files go,
and whatever the run identity leaves out (a study's sweep list, baseline, match request ...)."""

Key = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Variant:
    key: Key                          # ((group or override key, choice or value), ...)
    label: str
    records: tuple[dict[str, Any], ...]  # sorted by (data, seed, run_id)

    def on(self, data: str) -> list[dict[str, Any]]:
        return [r for r in self.records if data_of(r) == data]

    def finished_on(self, data: str) -> list[dict[str, Any]]:
        return [r for r in self.on(data) if r["status"] == "finished"]


def data_of(record: dict[str, Any]) -> str:
    return str(record["choices"].get("data") or record["config"].get("data", {}).get("name"))


def extra_overrides(record: dict[str, Any]) -> dict[str, str]:
    """Overrides other than group choices and neutral keys, as ``{key: value}``."""
    extras = {}
    for override in record.get("overrides") or []:
        key, _, value = str(override).lstrip("+~").partition("=")
        if key in record["choices"] or key.split(".")[0] in NEUTRAL_OVERRIDE_ROOTS:
            continue
        extras[key] = value
    return extras


def row_groups(records: list[dict[str, Any]]) -> list[str]:
    """The groups the records chose that shape the model (any group a record names, so a new
    config group is a facet without being listed anywhere), in display order."""
    groups = {g for r in records for g in r["choices"]} - set(PLUMBING_GROUPS)
    return sorted(groups, key=group_order)


def _facets(record: dict[str, Any], groups: list[str],
            settings: Sequence[str] = ()) -> dict[str, str]:
    facets = {g: str(record["choices"].get(g) or "") for g in groups}
    facets.update(extra_overrides(record))
    if settings:
        from xformer_bench.results.setups import setting

        own = setting(record)
        facets.update({k: own.get(k, "") for k in settings})
    return facets


def _facet_names(records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """The row groups, then override keys, that differ between records of one dataset; and
    the settings that still tell apart records those leave in one row on one dataset."""
    from xformer_bench.results.setups import unlike_settings

    groups = row_groups(records)
    facets = [(data_of(r), _facets(r, groups)) for r in records]
    names = groups + sorted({k for _, f in facets for k in f} - set(groups))

    def varies(name: str) -> bool:
        values: dict[str, set[str]] = {}
        for data, f in facets:
            values.setdefault(data, set()).add(f.get(name, ""))
        return any(len(v) > 1 for v in values.values())

    varying = [n for n in names if varies(n)]
    rows: dict[tuple, list[dict[str, Any]]] = {}
    for record, (data, f) in zip(records, facets):
        rows.setdefault((data, *(f.get(n, "") for n in varying)), []).append(record)
    return varying, [k for k in unlike_settings(rows.values()) if k not in varying]


def varying_facets(records: list[dict[str, Any]]) -> list[str]:
    """Row groups that differ between records of one dataset (in group order), then such
    override keys, then the settings that still tell such records apart.  What differs only
    from one dataset to another (``data.resolution=8`` on CIFAR-10, ``model=vit`` for images)
    describes the column, not the row."""
    varying, settings = _facet_names(records)
    return varying + settings


def label_of(record: dict[str, Any], key: Key) -> str:
    """The groups' YAML labels (else choice names) and the overrides it sets, joined; the
    model's label when nothing tells it apart.  A hybrid stack (``model.hybrid``) is named
    once, by its mixers and layout: "Linear attention + full attention every 2nd layer" for
    its attention or ``model.hybrid`` facet (a row without one: its attention's label),
    "Samba (...)" after its preset's label."""
    hybrid = hybrid_label(record["config"])
    parts: list[str] = []
    for name, value in key:
        if _is_hybrid_key(name):  # a row without the hybrid: its attention alone
            part = hybrid or _group_label(record, "attention")
        elif not (value or name in record["choices"]):
            continue
        elif hybrid and name == "attention":
            part = hybrid
        elif name in record["choices"]:
            part = _group_label(record, name)
        else:
            part = f"{name}={value}"
        if part not in parts and not (hybrid and part == hybrid and
                                      any(hybrid in p for p in parts)):
            parts.append(part)
    return ", ".join(parts) or _group_label(record, "model")


def _is_hybrid_key(name: str) -> bool:
    """An override of ``model.hybrid`` (``model.hybrid.every``, ``attention@model.hybrid...``)."""
    return name.startswith("model.hybrid") or "@model.hybrid" in name


def _group_label(record: dict[str, Any], group: str) -> str:
    node = record["config"].get(group)
    label = node.get("label") if isinstance(node, dict) else None
    text = str(label or record["choices"].get(group) or group)
    hybrid = hybrid_label(record["config"]) if group == "model" else None
    return f"{text} ({hybrid})" if hybrid else text


def sweep_order(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """The experiment's declared sweep (``config.sweep: {group: [options]}``), if any."""
    for record in sorted(records, key=lambda r: r["run_id"]):
        sweep = record["config"].get("sweep")
        if isinstance(sweep, dict):
            return {str(k): [str(v).strip() for v in (vals.split(",") if isinstance(vals, str)
                                                       else vals)]
                    for k, vals in sweep.items() if isinstance(vals, (str, list))}
    return {}


def _naming_facets(keys: list[Key], varying: list[str], groups: list[str],
                   sweep: dict[str, list[str]]) -> list[str]:
    """The facets a row label names: the swept groups and the differing overrides when they
    alone tell every row apart (``model=reformer`` picks its attention and stack: the row is
    "Reformer", not every group the preset chose), else every varying facet."""
    named = [n for n in varying if n in sweep or n not in groups]
    distinct = {tuple((n, v) for n, v in key if n in named) for key in keys}
    return named if named and len(distinct) == len(keys) else varying


def paper_label(records: Sequence[dict[str, Any]]) -> str | None:
    """The paper row the runs were made for (``paper_row``, :mod:`xformer_bench.paper_rows`),
    when they all name the same one."""
    labels = {r["config"].get("paper_row") for r in records}
    return str(labels.pop()) if len(labels) == 1 and None not in labels else None


def _paper_order(records: list[dict[str, Any]]) -> list[str]:
    """The row labels of the published table the runs' rows come from (``rows_from``)."""
    from xformer_bench.errors import ConfigError
    from xformer_bench.references import load
    from xformer_bench.references import names as shipped

    names = {str(r["config"]["rows_from"]) for r in records if r["config"].get("rows_from")}
    unknown = sorted(names - set(shipped()))
    if unknown:
        run = next(r["run_id"] for r in records
                   if str(r["config"].get("rows_from")) == unknown[0])
        raise ConfigError(f"rows_from: {unknown[0]} (run {run}) is no shipped reference table; "
                          f"shipped: {', '.join(shipped())}")
    return [row.label for row in load(names.pop()).rows] if len(names) == 1 else []


def group_variants(records: list[dict[str, Any]]) -> list[Variant]:
    """The experiment's variants, in sweep order when declared, else by label; rows made for a
    published table's rows are labelled and ordered as the paper prints them."""
    (varying, settings), groups = _facet_names(records), row_groups(records)
    varying = varying + settings
    by_key: dict[Key, list[dict[str, Any]]] = {}
    for record in records:
        facets = _facets(record, groups, settings)
        by_key.setdefault(tuple((n, facets.get(n, "")) for n in varying), []).append(record)
    sweep = sweep_order(records)
    named = _naming_facets(list(by_key), varying, groups, sweep)
    variants = []
    for key, members in by_key.items():
        members.sort(key=lambda r: (data_of(r), _seed_order(r["seed"]), r["run_id"]))
        label_key = tuple((n, v) for n, v in key if n in named)
        variants.append(Variant(key, paper_label(members) or label_of(members[0], label_key),
                                tuple(members)))
    paper = _paper_order(records)

    def position(variant: Variant) -> tuple:
        ranks = tuple(sweep[n].index(v) if v in sweep.get(n, []) else len(sweep.get(n, []))
                      for n, v in variant.key)
        in_paper = paper.index(variant.label) if variant.label in paper else len(paper)
        return in_paper, ranks, variant.label, variant.key

    return sorted(variants, key=position)


def _seed_order(seed: Any) -> tuple[bool, float, str]:
    number = isinstance(seed, (int, float)) and not isinstance(seed, bool)
    return not number, float(seed) if number else 0.0, str(seed)


def repeated_seeds(variants: list[Variant]) -> list[str]:
    """Warnings for a seed run twice in one variant: configurations the key cannot tell apart."""
    warnings = []
    for variant in variants:
        counts = Counter((data_of(r), str(r["seed"])) for r in variant.records)
        for (data, seed), n in sorted(counts.items()):
            if n > 1:
                warnings.append(f"{variant.label!r} has {n} runs of seed {seed} on {data} "
                                f"(different configurations averaged as seeds?)")
    return warnings
