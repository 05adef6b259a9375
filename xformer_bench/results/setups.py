"""Runs a table must neither average as seeds nor set side by side, and what tells them apart.

Within a row, on one dataset, runs are seeds of one configuration.  A setting of the run
identity (the configuration less the seed and the plumbing that does not change what a run
computes: :func:`setting`) in which they differ -- ``trainer.max_steps``, ``data.path``,
``model.d_model`` -- splits the row and names it ("ReLU, trainer.max_steps=3"):
:func:`unlike_settings`, used by :func:`~xformer_bench.results.variants.group_variants`.

Across datasets, a table's columns share the study's scale: the :data:`SCALE_KEYS` its runs on
the main dataset agree on.  Runs on another dataset at another scale (a 3-step smoke run
beside 300-step runs) are another study, with a table of their own: :func:`split_studies`.
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
    dataset's in a :data:`SCALE_KEYS` value all those agree on, saying in what."""
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
