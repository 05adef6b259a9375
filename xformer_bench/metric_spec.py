"""What a task declares about each metric it reports, and what a run record carries of it.

A task logs a metric as ``<split>/<name>`` (``val/bpb``, ``test/top1``); the record keeps the
task's specs (schema 2) so that tables take each column's title, direction and precision from
the run itself, never from a list of datasets.

Language modelling scores bits per evaluated unit, named by the data's unit (:data:`BITS_PER`):
text per byte (``bpb``), images per dimension -- one colour channel of one pixel --
(``bits_per_dim``), the tokens of a synthetic task per token (``bits_per_token``: over the scored
positions only, e.g. the copied half of ``data=copy``).  Data that scores recall also reports,
first, the :data:`ACCURACY` of the most likely token at its scored positions.  Schema-1
records, all byte-level, are read as carrying ``BITS_PER["bytes"]``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from xformer_bench.errors import ConfigError


@dataclass(frozen=True)
class MetricSpec:
    name: str                       # logged as "<split>/<name>": "bpb", "bits_per_dim", "top1"
    title: str                      # shown after the dataset in a column title: "bits/dim"
    higher_is_better: bool = False
    digits: int = 3                 # decimals shown in tables
    scale: float = 1.0              # shown value = scale * recorded value (100: a percentage)

    def key(self, split: str) -> str:
        """The logged and recorded key on ``split``: ``key("test") == "test/bpb"``."""
        return f"{split}/{self.name}"

    def as_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, spec: Any) -> MetricSpec:
        """The spec a record carries; ``ValueError`` naming what is wrong with it."""
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
            raise ValueError(f"metric spec {spec!r} is not a dict with a 'name'")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in spec.items() if k in known}
                   | {"title": spec.get("title") or spec["name"]})


BITS_PER = {
    "bytes": MetricSpec("bpb", "bpb"),
    "dims": MetricSpec("bits_per_dim", "bits/dim"),
    "tokens": MetricSpec("bits_per_token", "bits/token"),
}
"""Evaluated unit -> the metric reporting mean cross-entropy / ln 2 per unit."""


ACCURACY = MetricSpec("accuracy", "accuracy %", higher_is_better=True, digits=1, scale=100.0)
"""Language modelling on data that scores it (``scores_accuracy``, e.g. ``data=mqar``): the
fraction of scored positions whose most likely token is the target -- Zoology's recall
accuracy over the queried positions (Arora et al. 2023)."""


def bits_metric(unit: str) -> MetricSpec:
    """The bits-per-unit metric of ``unit``; a :class:`ConfigError` for a unit without one."""
    if unit not in BITS_PER:
        raise ConfigError(f"the lm task has no metric per {unit!r}; a language-modelling "
                          f"datamodule's unit is one of: {', '.join(BITS_PER)}")
    return BITS_PER[unit]
