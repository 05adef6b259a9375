"""A table's metric columns, read from the metric specs the records carry (schema 2).

A column is one (dataset, metric) pair -- CIFAR-10 bits/dim of the pixel LM and CIFAR-10
top-1 of the classifier are two columns -- and takes its title, direction (which value is
bold) and precision from the spec its task declared, never from a list of datasets.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from xformer_bench.metric_spec import MetricSpec
from xformer_bench.results.variants import data_of


@dataclass(frozen=True)
class Metric:
    data: str                       # the data group's choice name
    spec: MetricSpec

    @property
    def column_key(self) -> str:
        return f"{self.data}_{self.spec.name}"

    @property
    def title(self) -> str:
        return f"{self.data} {self.spec.title}"

    @property
    def test_key(self) -> str:      # key in the record's "test" dict
        return self.spec.key("test")


def metrics_of(record: dict[str, Any]) -> list[Metric]:
    """The metrics a record declares, on its dataset, primary first."""
    return [Metric(data_of(record), MetricSpec.from_record(s)) for s in record["metrics"]]


def table_metrics(records: Iterable[dict[str, Any]], datasets: list[str]) -> list[Metric]:
    """Every metric the records declare, by dataset in ``datasets`` order, each column once
    (its spec from the first record that declares it)."""
    found: dict[str, Metric] = {}
    for record in records:
        for metric in metrics_of(record):
            found.setdefault(metric.column_key, metric)
    return sorted(found.values(), key=lambda m: datasets.index(m.data))
