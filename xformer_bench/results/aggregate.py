"""Variants -> a :class:`Table` in the shape of Narang et al. (2021) Table 1.

Columns: Params (and Active params when a routed layer makes them differ), Ops (FLOPs per
step), Attended % (of the allowed (query, key) pairs at the run's length, when records carry
it), Step/s, Step MiB (the tensors one training step allocates, measured before training),
Peak MiB (a GPU run's own peak: see ``PER_RUN_MEMORY``), Early loss, Final loss, one column per test metric the records declare on each
dataset (:mod:`metrics`), Seeds.  Only finished runs are averaged; a variant with none shows
its status instead.  Params, Ops, Step/s, the losses and Seeds come from the dataset with the
most runs (ties: the first the sweep declares, then by name) -- the pre-training task of
the survey.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from xformer_bench.results import confounds
from xformer_bench.results.metrics import Metric, table_metrics
from xformer_bench.results.record import PER_RUN_MEMORY, STATUSES
from xformer_bench.results.significance import holm_bonferroni, welch_p_value
from xformer_bench.results.table import Cell, Column, Row, Table
from xformer_bench.results.variants import (Variant, _naming_facets, data_of, row_groups,
                                            sweep_order, varying_facets)

LOSS_KEY = "val/loss"
Extract = Callable[[dict[str, Any]], Any]


def summarize(values: list[float]) -> Cell:
    """Mean and sample standard deviation (ddof=1); no std for a single value."""
    if not values:
        return Cell()
    array = np.asarray(values, dtype=float)
    std = float(np.std(array, ddof=1)) if array.size > 1 else None
    return Cell(mean=float(np.mean(array)), std=std, n=int(array.size))


def status_text(runs: list[dict[str, Any]]) -> str:
    """The statuses of runs none of which finished: 'diverged' or 'diverged/failed'."""
    present = {r["status"] for r in runs}
    return "/".join(s for s in STATUSES if s in present)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def measured(runs: list[dict[str, Any]], extract: Extract) -> Cell:
    """Mean ± std of ``extract`` over the finished runs; their status when none finished."""
    if not runs:
        return Cell()
    finished = [r for r in runs if r["status"] == "finished"]
    if not finished:
        return Cell(text=status_text(runs))
    values = [v for v in (_finite(extract(r)) for r in finished) if v is not None]
    return summarize(values)


def configured(runs: list[dict[str, Any]], key: str) -> Cell:
    """A property of the configuration (params, FLOPs): any run's value, finished first."""
    ordered = sorted(runs, key=lambda r: r["status"] != "finished")
    for run in ordered:
        value = _finite(run.get(key))
        if value is not None:
            return Cell(mean=value, n=1)
    return Cell()


def _attended_percent(record: dict[str, Any]) -> float | None:
    """The share of the allowed (query, key) pairs the run's attention attends at its length
    (``attention_coverage``, measured before training), in percent; None where not measured."""
    coverage = record.get("attention_coverage") or {}
    fraction = _finite(coverage.get("attended_fraction"))
    return None if fraction is None else 100 * fraction


def _metric_value(metric: Metric) -> Extract:
    def extract(record: dict[str, Any]) -> Any:
        value = (record.get("test") or {}).get(metric.test_key)
        return value * metric.spec.scale if _finite(value) is not None else None

    return extract


def _per_run_memory(record: dict[str, Any]) -> Any:
    return record.get("peak_memory_mb") if record.get("peak_memory_kind") in PER_RUN_MEMORY else None


def _loss_at(point: str) -> Extract:
    return lambda record: (record.get(point) or {}).get(LOSS_KEY)


def _seeds(runs: list[dict[str, Any]]) -> Cell:
    if not runs:
        return Cell()
    finished = sum(r["status"] == "finished" for r in runs)
    return Cell(text=str(finished) if finished == len(runs) else f"{finished}/{len(runs)}")


def datasets_of(variants: list[Variant]) -> list[str]:
    """The experiment's datasets, the one with most runs (the pre-training task) first; ties in
    the order the study's sweep declares them, then by name."""
    records = [r for v in variants for r in v.records]
    counts = Counter(data_of(r) for r in records)
    declared = sweep_order(records).get("data", [])

    def rank(data: str) -> tuple:
        return -counts[data], declared.index(data) if data in declared else len(declared), data

    return sorted(counts, key=rank)


def columns_for(variants: list[Variant]) -> tuple[list[Column], list[Metric], str]:
    """The columns, the metric behind each metric column, and the loss columns' dataset."""
    records = [r for v in variants for r in v.records]
    datasets = datasets_of(variants)
    metrics = table_metrics(records, datasets)
    per_run_memory = any(r.get("peak_memory_kind") in PER_RUN_MEMORY for r in records)
    step_memory = any(_finite(r.get("step_memory_mb")) is not None for r in records)
    routed = any(_finite(r.get("active_params")) not in (None, _finite(r.get("params")))
                 for r in records)
    protocols = {repr(sorted((r.get("eval_protocol") or {}).items())) for r in records}
    coverage = any(_attended_percent(r) is not None for r in records)
    columns = [
        Column("params", "Params", kind="si"),
        *([Column("active_params", "Active params", kind="si")] if routed else []),
        Column("ops", "Ops", kind="si"),
        *([Column("attended", "Attended %", digits=1)] if coverage else []),
        Column("steps_per_sec", "Step/s", digits=2),
        *([Column("step_memory", "Step MiB", digits=1)] if step_memory else []),
        *([Column("peak_memory", "Peak MiB", digits=0)] if per_run_memory else []),
        Column("early_loss", "Early loss", digits=3, higher_is_better=False),
        Column("final_loss", "Final loss", digits=3, higher_is_better=False),
        *(Column(m.column_key, m.title, digits=m.spec.digits,
                 higher_is_better=m.spec.higher_is_better) for m in metrics),
        *([Column("eval_protocol", "Eval", kind="text")] if len(protocols) > 1 else []),
        Column("seeds", "Seeds", kind="text"),
    ]
    return columns, metrics, (datasets[0] if datasets else "")


def row_for(variant: Variant, columns: list[Column], metrics: list[Metric],
            loss_data: str) -> Row:
    runs = variant.on(loss_data)
    cell_of: dict[str, Callable[[], Cell]] = {
        "params": lambda: configured(runs, "params"),
        "active_params": lambda: configured(runs, "active_params"),
        "ops": lambda: configured(runs, "flops_per_step"),
        "attended": lambda: configured([{**r, "attended": _attended_percent(r)} for r in runs],
                                       "attended"),
        "steps_per_sec": lambda: measured(runs, lambda r: r.get("steps_per_sec")),
        "peak_memory": lambda: measured(runs, _per_run_memory),
        "step_memory": lambda: configured(runs, "step_memory_mb"),
        "early_loss": lambda: measured(runs, _loss_at("early")),
        "final_loss": lambda: measured(runs, _loss_at("final")),
        "seeds": lambda: _seeds(runs),
        "eval_protocol": lambda: _protocol(runs),
    }
    for m in metrics:
        cell_of[m.column_key] = lambda m=m: measured(variant.on(m.data), _metric_value(m))
    statuses = Counter(r["status"] for r in runs)
    return Row(label=variant.label, key=variant.key,
               cells=tuple(cell_of[c.key]() for c in columns),
               finished=statuses["finished"], total=len(runs),
               statuses=";".join(f"{s}={statuses[s]}" for s in STATUSES if statuses[s]))


def _protocol(runs: list[dict[str, Any]]) -> Cell:
    """The evaluation protocol of the row's runs (the first's: one configuration, one
    protocol), short: 'streams, 10 lanes, memory 128, warm'."""
    text = confounds.protocol_text(runs[0].get("eval_protocol"), short=True) if runs else ""
    return Cell(text=text) if text else Cell()


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
    declared by the study), or None."""
    if not baseline:
        return None
    for i, variant in enumerate(variants):
        if all(all(str(r["choices"].get(g)) == str(o) for g, o in baseline.items())
               for r in variant.records):
            return i
    return None


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
                allowed_differences: tuple[str, ...] = ()) -> Table:
    """The table of ``variants``; with a ``baseline`` (the study's declared row), the cells
    that differ significantly from it are marked and each row carries its differences from
    it besides what names it (:mod:`confounds`; ``allowed_differences``: the study's)."""
    columns, metrics, loss_data = columns_for(variants)
    rows = mark_best(columns, [row_for(v, columns, metrics, loss_data) for v in variants])
    reference = baseline_index(variants, baseline)
    if reference is not None:
        rows = mark_significant(columns, rows, reference)
        rows = _with_differences(rows, variants, reference, loss_data, allowed_differences)
    labels = [_data_label(r) for v in variants for r in v.on(loss_data)]
    return Table(experiment=experiment, columns=tuple(columns), rows=tuple(rows),
                 loss_data=labels[0] if labels else loss_data,
                 baseline=None if reference is None else variants[reference].label,
                 noise_floor=() if reference is None else noise_floors(columns, rows, reference),
                 comparisons=0 if reference is None else len(rows) - 1)


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
