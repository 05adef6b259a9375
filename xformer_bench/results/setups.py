"""Runs a table must neither average as seeds nor set side by side, and what tells them apart.

Within a row, on one dataset, runs are seeds of one configuration.  A setting of the run
identity (the configuration less the seed and the plumbing that does not change what a run
computes: :func:`setting`) in which they differ -- ``trainer.max_steps``, ``data.path``,
``model.d_model`` -- splits the row and names it ("ReLU, trainer.max_steps=3"):
:func:`unlike_settings`, used by :func:`~xformer_bench.results.variants.group_variants`.

Across datasets, a table's columns share the study's scale: the :data:`SCALE_KEYS` its runs on
the main dataset agree on.  Runs on another dataset at another scale (a 3-step smoke run
beside 300-step runs) are another study, with a table of their own: :func:`split_studies`.

On one dataset, a run given a budget (:data:`BUDGET_KEYS`) on the command line that the
study's own runs do not have (``xbench experiment=smoke trainer.max_steps=2``: a debugging run)
is another setup, with a table of its own too, never a row of the study's: :func:`by_budget`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from xformer_bench.config import flatten
from xformer_bench.results.confounds import ignored_key, value_text
from xformer_bench.results.record import identity_config
from xformer_bench.results.variants import data_of

SCALE_KEYS = ("trainer.max_steps", "model.d_model", "model.n_layers", "model.n_heads",
              "model.d_ff")
"""What sizes a study: its training budget and model sizes."""
BUDGET_KEYS = ("trainer.max_steps", "data.batch_size", "data.seq_len")
"""What a run is trained for: a run given another value on the command line is another setup."""
KEPT_PLUMBING = ("data.path",)
"""Plumbing to the confounds (where the file lies), yet another file is another corpus."""


def setting(record: dict[str, Any]) -> dict[str, str]:
    """The record's run identity as ``{dotted key: value text}``, less the seed and plumbing
    (:mod:`~xformer_bench.results.confounds`' ignored keys, but :data:`KEPT_PLUMBING`)."""
    flat = flatten(identity_config(record["config"]))
    return {key: value_text(value) for key, value in flat.items()
            if key in KEPT_PLUMBING or not ignored_key(key, set())}


def unlike_settings(groups: Iterable[Sequence[dict[str, Any]]]) -> list[str]:
    """The settings whose values differ between the runs of any one group (a row's runs on
    one dataset), sorted."""
    found: set[str] = set()
    for runs in groups:
        settings = [setting(r) for r in runs]
        keys = set().union(*settings) if settings else set()
        found |= {k for k in keys if len({s.get(k) for s in settings}) > 1}
    return sorted(found)


@dataclass(frozen=True)
class Study:
    name: str                        # the table's name: the experiment, or <experiment>__<data>
    records: list[dict[str, Any]]
    apart: str = ""                  # why these runs are not in the experiment's table


def _at(record: dict[str, Any], dotted: str) -> str:
    node: Any = record["config"]
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return value_text(node)


def split_studies(experiment: str, records: list[dict[str, Any]]) -> list[Study]:
    """The experiment's table (first), then one per dataset whose runs differ from the main
    dataset's in a :data:`SCALE_KEYS` value all those agree on, saying in what; each of these
    less its runs of another budget (:func:`by_budget`), which follow as tables of their own."""
    return [part for study in _by_dataset(experiment, records) for part in by_budget(study)]


def _sets(record: dict[str, Any], key: str) -> bool:
    """Whether the record's command line set ``key`` (``key=``, ``+key=``, ``++key=``)."""
    return any(str(o).lstrip("+~").partition("=")[0] == key for o in record.get("overrides") or [])


def _budgets(runs: list[dict[str, Any]], swept: set[str]) -> dict[str, set[str]]:
    """Per :data:`BUDGET_KEYS` key the study does not sweep: the values the study gave its runs
    (those of the runs that did not set it on the command line); when every run set it, the
    value most runs have (none where several tie: a sweep of the key)."""
    from collections import Counter

    budgets = {}
    for key in BUDGET_KEYS:
        if key in swept:
            continue
        declared = {_at(r, key) for r in runs if not _sets(r, key)}
        if not declared:
            counts = Counter(_at(r, key) for r in runs).most_common()
            unique = len(counts) == 1 or counts[0][1] > counts[1][1]
            declared = {counts[0][0]} if counts and unique else set()
        if declared:
            budgets[key] = declared
    return budgets


def by_budget(study: Study) -> list[Study]:
    """``study`` less the runs given a budget on the command line that the study's runs on the
    same dataset do not have (:data:`BUDGET_KEYS`; a key the study sweeps is a row's, not a
    budget), then those runs, one table per such budget, each saying in what it differs."""
    from xformer_bench.results.variants import sweep_order

    swept = set(sweep_order(study.records))
    by_data: dict[str, list[dict[str, Any]]] = {}
    for record in study.records:
        by_data.setdefault(data_of(record), []).append(record)
    kept: list[dict[str, Any]] = []
    apart: dict[tuple, list[dict[str, Any]]] = {}
    for data, runs in by_data.items():
        budgets = _budgets(runs, swept)
        for record in runs:
            differs = tuple((key, _at(record, key), "/".join(sorted(values)))
                            for key, values in budgets.items()
                            if _sets(record, key) and _at(record, key) not in values)
            (apart.setdefault((data, differs), []) if differs else kept).append(record)
    studies = [Study(study.name, kept, study.apart)]
    for (data, differs), runs in sorted(apart.items()):
        tag = "__".join(f"{key.rsplit('.', 1)[-1]}_{value}" for key, value, _ in differs)
        what = "; ".join(f"{key} {value} (not {declared})" for key, value, declared in differs)
        runs_differ = (f"{len(runs)} runs on {data} differ" if len(runs) > 1
                       else f"1 run on {data} differs")
        studies.append(Study(f"{study.name}__{tag}", runs,
                             f"a separate setup: {runs_differ} from the study's runs in {what}"))
    return studies if kept else studies[1:]


def _by_dataset(experiment: str, records: list[dict[str, Any]]) -> list[Study]:
    from xformer_bench.results.aggregate import rank_datasets

    datasets = rank_datasets(records)
    if len(datasets) < 2:
        return [Study(experiment, records)]
    main = datasets[0]
    values = {key: {_at(r, key) for r in records if data_of(r) == main} for key in SCALE_KEYS}
    scale = {key: found.pop() for key, found in values.items() if len(found) == 1}
    kept: list[dict[str, Any]] = []
    apart: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        differs = any(_at(record, key) != value for key, value in scale.items())
        (apart.setdefault(data_of(record), []) if differs else kept).append(record)
    studies = [Study(experiment, kept)]
    for data in sorted(apart):
        runs = apart[data]
        what = "; ".join(f"{key} {'/'.join(sorted({_at(r, key) for r in runs}))} (not {value})"
                         for key, value in scale.items()
                         if any(_at(r, key) != value for r in runs))
        runs_differ = f"{len(runs)} runs on {data} differ" if len(runs) > 1 else \
            f"1 run on {data} differs"
        studies.append(Study(f"{experiment}__{data}", runs,
                             f"{runs_differ} from the runs on {main} in {what}"))
    return studies
