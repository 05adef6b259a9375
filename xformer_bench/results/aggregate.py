"""Variants -> a :class:`Table` in the shape of Narang et al. (2021) Table 1: the columns
declared in :mod:`columns` that the records can fill, the cells of each row from the dataset
with the most runs (ties: the first the sweep declares, then by name) -- the pre-training task
of the survey -- and, against a study's baseline row, the best values in bold, the
significant differences marked (:func:`mark_significant`) and each row's confounds
(:mod:`confounds`).
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from xformer_bench.references import ReferenceTable
from xformer_bench.results import confounds
from xformer_bench.results.columns import AFTER_METRICS, BEFORE_METRICS, ColumnSpec, metric_spec
from xformer_bench.results.baseline_standing import standing
from xformer_bench.results.final_validation import final_at
from xformer_bench.results.ngram_floors import floors_sentence
from xformer_bench.results.metrics import Metric, table_metrics
from xformer_bench.results.paper_columns import Comparison, beside, summary, with_agreement
from xformer_bench.results.record import STATUSES
from xformer_bench.results.significance import holm_bonferroni, welch_p_value
from xformer_bench.results.table import Column, Row, Table
from xformer_bench.results.variants import (Variant, _naming_facets, data_of, row_groups,
                                            sweep_order, varying_facets)
from xformer_bench.results.equal_compute_note import equal_compute_sentence

def datasets_of(variants: list[Variant]) -> list[str]:
    """The variants' datasets, ranked as :func:`rank_datasets` ranks them."""
    return rank_datasets([r for v in variants for r in v.records])


def rank_datasets(records: list[dict[str, Any]]) -> list[str]:
    """The records' datasets, the one with most runs (the pre-training task) first; ties in
    the order the study's sweep declares them, then by name."""
    counts = Counter(data_of(r) for r in records)
    declared = sweep_order(records).get("data", [])

    def rank(data: str) -> tuple:
        return -counts[data], declared.index(data) if data in declared else len(declared), data

    return sorted(counts, key=rank)


def columns_for(variants: list[Variant], comparison: Comparison | None = None,
                ) -> tuple[list[Column], list[Metric], str]:
    """The columns shown (:mod:`columns`; with a ``comparison``, the paper's beside them), the
    metric behind each metric column, and the loss columns' dataset."""
    records = [r for v in variants for r in v.records]
    datasets = datasets_of(variants)
    metrics = table_metrics(records, datasets)
    specs = _specs(records, metrics, lambda data: [], comparison)
    return [spec.column for spec in specs], metrics, (datasets[0] if datasets else "")


def _declared_specs(metrics: list[Metric], runs_on: Callable[[str], list[dict[str, Any]]],
              comparison: Comparison | None) -> list[ColumnSpec]:
    declared = [*BEFORE_METRICS, *(metric_spec(m, runs_on) for m in metrics), *AFTER_METRICS]
    if comparison is None:
        return declared
    return beside(declared, {m.column_key: m.spec.name for m in metrics}, comparison)


def _specs(records: list[dict[str, Any]], metrics: list[Metric],
           runs_on: Callable[[str], list[dict[str, Any]]],
           comparison: Comparison | None = None) -> list[ColumnSpec]:
    return [spec for spec in _declared_specs(metrics, runs_on, comparison) if spec.shown(records)]


def row_for(variant: Variant, columns: list[Column], metrics: list[Metric],
            loss_data: str, comparison: Comparison | None = None) -> Row:
    runs = variant.on(loss_data)
    specs = {spec.column.key: spec for spec in _declared_specs(metrics, variant.on, comparison)}
    statuses = Counter(r["status"] for r in runs)
    return Row(label=variant.label, key=variant.key,
               cells=tuple(specs[c.key].cell(runs) for c in columns),
               finished=statuses["finished"], total=len(runs),
               statuses=";".join(f"{s}={statuses[s]}" for s in STATUSES if statuses[s]))


def mark_best(columns: list[Column], rows: list[Row]) -> list[Row]:
    """Bold the best shown value of each metric column (ties at shown precision all bold)."""
    cells = [list(row.cells) for row in rows]
    for j, column in enumerate(columns):
        if column.higher_is_better is None:
            continue
        shown = {i: round(c[j].mean, column.digits) for i, c in enumerate(cells)
                 if c[j].mean is not None}
        if len(shown) < 2:
            continue
        best = max(shown.values()) if column.higher_is_better else min(shown.values())
        for i, value in shown.items():
            if value == best:
                cells[i][j] = replace(cells[i][j], bold=True)
    return [replace(row, cells=tuple(c)) for row, c in zip(rows, cells)]


def baseline_index(variants: list[Variant], baseline: Mapping[str, Any] | None) -> int | None:
    """The row whose runs all chose every option of ``baseline`` (``{"activation": "relu"}``,
    declared by the study) -- of several (split by a setting), the one with most runs -- or
    None."""
    if not baseline:
        return None
    matching = [i for i, variant in enumerate(variants)
                if all(all(str(r["choices"].get(g)) == str(o) for g, o in baseline.items())
                       for r in variant.records)]
    return max(matching, key=lambda i: len(variants[i].records), default=None)


def mark_significant(columns: list[Column], rows: list[Row], baseline: int) -> list[Row]:
    """Per metric column, Welch's t-test of each row against the baseline row over seeds, Holm's
    correction over the rows tested (:func:`holm_bonferroni`, family-wise p < ALPHA): a
    significant cell is marked.  Every cell keeps its uncorrected p-value (the CSV shows it).
    A difference smaller than the baseline's seed-to-seed std (the noise floor) is never marked,
    nor bold."""
    cells = [list(row.cells) for row in rows]
    for j, column in enumerate(columns):
        reference = cells[baseline][j]
        if column.higher_is_better is None or reference.mean is None:
            continue
        others = [i for i, row_cells in enumerate(cells)
                  if i != baseline and row_cells[j].mean is not None]
        p_values = []
        for i in others:
            cell = cells[i][j]
            p = welch_p_value(cell.mean, cell.std or 0.0, cell.n, reference.mean,
                              reference.std or 0.0, reference.n)
            cells[i][j] = replace(cell, p_value=p,
                                  untestable=p is None and min(cell.n, reference.n) >= 2)
            p_values.append(p)
        floor = reference.std or 0.0
        for i, significant in zip(others, holm_bonferroni(p_values)):
            cell = cells[i][j]
            within_noise = abs(cell.mean - reference.mean) < floor
            cells[i][j] = replace(cell, marked=significant and not within_noise,
                                  bold=cell.bold and not within_noise)
    return [replace(row, cells=tuple(c)) for row, c in zip(rows, cells)]


def noise_floors(columns: list[Column], rows: list[Row], baseline: int) -> tuple[tuple[str, float], ...]:
    """(column title, the baseline row's seed-to-seed std) of every metric column with one."""
    return tuple((column.title, cell.std) for column, cell in zip(columns, rows[baseline].cells)
                 if column.higher_is_better is not None and cell.std is not None)


def build_table(experiment: str, variants: list[Variant],
                baseline: Mapping[str, Any] | None = None,
                allowed_differences: tuple[str, ...] = (),
                paper: ReferenceTable | None = None) -> Table:
    """The table of ``variants``; with a ``baseline`` (the study's declared row), the cells
    that differ significantly from it are marked and each row carries its differences from
    it besides what names it (:mod:`confounds`; ``allowed_differences``: the study's); with a
    ``paper`` (the study's ``reference``), the paper beside the measurement
    (:mod:`paper_columns`)."""
    comparison = None if paper is None else Comparison(paper, baseline)
    columns, metrics, loss_data = columns_for(variants, comparison)
    rows = mark_best(columns, [row_for(v, columns, metrics, loss_data, comparison)
                               for v in variants])
    reference = baseline_index(variants, baseline)
    if reference is not None:
        rows = mark_significant(columns, rows, reference)
        rows = _with_differences(rows, variants, reference, loss_data, allowed_differences)
    if comparison is not None and reference is not None:
        rows = with_agreement(columns, rows, reference)
    lines = () if comparison is None else summary(
        columns, rows, [_seed_rows(v, columns, metrics, loss_data, comparison) for v in variants],
        paper)
    loss_runs = [r for v in variants for r in v.on(loss_data)]
    labels = [_data_label(r) for r in loss_runs]
    learned = None if reference is None else standing(variants[reference].on(loss_data),
                                                      variants[reference].label)
    return Table(experiment=experiment, columns=tuple(columns), rows=tuple(rows),
                 loss_data=labels[0] if labels else loss_data,
                 baseline=None if reference is None else variants[reference].label,
                 noise_floor=() if reference is None else noise_floors(columns, rows, reference),
                 comparisons=0 if reference is None else len(rows) - 1,
                 notes=(*column_notes(variants, metrics, loss_data, rows, comparison),
                        *filter(None, [floors_sentence(loss_runs),
                                       learned and learned.sentence,
                                       equal_compute_sentence(variants)])),
                 summary=lines, final_at=final_at(loss_runs),
                 early_learning=bool(learned and learned.early))


def _seed_rows(variant: Variant, columns: list[Column], metrics: list[Metric], loss_data: str,
               comparison: Comparison) -> list[Row]:
    """The variant's row computed from each of its seeds alone (what the bootstrap resamples)."""
    seeds = sorted({r["seed"] for r in variant.on(loss_data)}, key=str)
    return [row_for(replace(variant, records=tuple(r for r in variant.records if r["seed"] == s)),
                    columns, metrics, loss_data, comparison) for s in seeds]


def column_notes(variants: list[Variant], metrics: list[Metric], loss_data: str,
                 rows: list[Row], comparison: Comparison | None = None) -> tuple[str, ...]:
    """The sentences the shown columns add to the caption (``ColumnSpec.caption``: where
    Step/s comes from, what its marks mean), from their cells and the runs on ``loss_data``."""
    records = [r for v in variants for r in v.on(loss_data)]
    shown = _specs([r for v in variants for r in v.records], metrics, lambda data: [],
                   comparison)
    notes = (spec.caption(records, [row.cells[j] for row in rows])
             for j, spec in enumerate(shown))
    return tuple(note for note in notes if note)


def _with_differences(rows: list[Row], variants: list[Variant], reference: int, loss_data: str,
                      allowed: tuple[str, ...]) -> list[Row]:
    records = [r for v in variants for r in v.records]
    named = _naming_facets([v.key for v in variants], varying_facets(records),
                           row_groups(records), sweep_order(records))
    return [replace(row, differences=confounds.row_differences(
                variant, variants[reference], loss_data, named, allowed))
            for row, variant in zip(rows, variants)]


def _data_label(record: dict[str, Any]) -> str:
    node = record["config"].get("data")
    return str((node.get("label") if isinstance(node, dict) else None) or data_of(record))
