"""Which test metric each dataset contributes to a table, and which way is better.

One row per (dataset, metric): adding a task adds a line here.  A dataset not listed still
gets a column for each ``test/*`` key its records carry (lower is better unless the key is
in :data:`HIGHER_IS_BETTER_KEYS`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    data: str                       # the data group's choice name
    key: str                        # key in the record's "test" dict
    title: str                      # column title
    higher_is_better: bool = False
    digits: int = 3
    scale: float = 1.0              # shown value = scale * recorded value

    @property
    def column_key(self) -> str:
        return f"{self.data}_{self.key.split('/')[-1]}"


METRICS: tuple[Metric, ...] = (
    Metric("enwik8", "test/bpb", "enwik8 bpb"),
    Metric("text", "test/bpb", "text bpb"),
    Metric("synthetic", "test/bpb", "synthetic bpb"),
    Metric("cifar10", "test/bits_per_dim", "CIFAR-10 bits/dim"),
    Metric("wmt", "test/bleu", "WMT BLEU", higher_is_better=True, digits=2),
    Metric("imagenet", "test/top1", "ImageNet top-1 (%)", higher_is_better=True, digits=2,
           scale=100.0),
)

HIGHER_IS_BETTER_KEYS = ("test/bleu", "test/top1", "test/top5", "test/accuracy")


def metrics_for(data: str, test_keys: Iterable[str]) -> list[Metric]:
    """The declared metrics of ``data``, else one per recorded test key (less the loss)."""
    declared = [m for m in METRICS if m.data == data]
    if declared:
        return declared
    return [Metric(data, key, f"{data} {key.split('/')[-1]}", key in HIGHER_IS_BETTER_KEYS)
            for key in sorted(set(test_keys)) if key != "test/loss"]


def dataset_order(names: Iterable[str]) -> list[str]:
    """Declared datasets in :data:`METRICS` order, then the others by name."""
    names = set(names)
    declared = list(dict.fromkeys(m.data for m in METRICS if m.data in names))
    return declared + sorted(names - set(declared))
