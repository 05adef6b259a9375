"""The table's columns, declared once: each a :class:`Column` (title, format, which way is
better), when it is shown (a predicate over all the study's records), and how a row's cell is
computed from that row's runs (:class:`ColumnSpec`).  The metric columns (one per test metric
the records declare, :mod:`metrics`) sit between :data:`BEFORE_METRICS` and
:data:`AFTER_METRICS`.  A new column is one entry here.

Cells: only finished runs are averaged (:func:`measured`: mean ± sample std), a configuration
property (:func:`configured`: params, FLOPs) is any run's value; a row none of whose runs
finished shows its status.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from xformer_bench.results import confounds
from xformer_bench.results.metrics import Metric
from xformer_bench.results.record import PER_RUN_MEMORY, STATUSES
from xformer_bench.results.speed import CALIBRATED, TIMING_FILE
from xformer_bench.results.table import Cell, Column
from xformer_bench.results.variants import data_of

LOSS_KEY = "val/loss"
Extract = Callable[[dict[str, Any]], Any]
Runs = list[dict[str, Any]]


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


def _protocol(runs: list[dict[str, Any]]) -> Cell:
    """The evaluation protocol of the row's runs (the first's: one configuration, one
    protocol), short: 'streams, 10 lanes, memory 128, warm'."""
    text = confounds.protocol_text(runs[0].get("eval_protocol"), short=True) if runs else ""
    return Cell(text=text) if text else Cell()


MAX_SPEED_SPREAD = 0.30
"""A speed whose ± exceeds this share of its value is not a result (flagged)."""
PERTURBED, WIDE_SPREAD = "*", "§"


def _speed(runs: Runs) -> Cell:
    """Step/s: the row's calibrated timing (median ± IQR over the timing pass's repeats,
    :mod:`~xformer_bench.results.speed`) where measured, else the runs' (mean ± std); marked
    :data:`PERTURBED` when measured while other work shared the machine (the pass's or a
    finished run's ``timing_conditions``), :data:`WIDE_SPREAD` when its ± exceeds
    :data:`MAX_SPEED_SPREAD` of its value."""
    timed = next((r[CALIBRATED] for r in runs if r.get(CALIBRATED)), None)
    if timed:
        cell = Cell(mean=timed["steps_per_sec"], std=timed["iqr"], n=len(timed["rates"]))
        conditions = [timed.get("conditions") or {}]
    else:
        cell = measured(runs, lambda r: r.get("steps_per_sec"))
        conditions = [r.get("timing_conditions") or {} for r in runs if r["status"] == "finished"]
    if cell.mean is not None and any(c.get("alone") is False for c in conditions):
        cell = replace(cell, footnote=PERTURBED)
    if cell.mean and cell.std is not None and cell.std > MAX_SPEED_SPREAD * cell.mean:
        cell = replace(cell, footnote=cell.footnote + WIDE_SPREAD)
    return cell


def _speed_caption(records: Runs, cells: list[Cell]) -> str:
    """Where Step/s comes from, when not (all) from the runs, and its marks."""
    timed = [r[CALIBRATED] for r in records if r.get(CALIBRATED)]
    sentences = []
    if timed:
        settings = sorted({f"{t['repeats']} repeats of {t['steps']} training steps"
                           for t in timed})
        untimed = any(not r.get(CALIBRATED) for r in records if r["status"] == "finished")
        sentences.append(f"Step/s: median ± IQR over {' or '.join(settings)} per row, the rows "
                         f"timed round-robin in one calibrated pass ({TIMING_FILE})"
                         + ("; rows without one: mean ± std over their runs." if untimed else "."))
    if any(PERTURBED in c.footnote for c in cells):
        sentences.append(f"{PERTURBED} perturbed: measured while other work shared the machine "
                         "(timing_conditions): not a result.")
    if any(WIDE_SPREAD in c.footnote for c in cells):
        sentences.append(f"{WIDE_SPREAD} speed spread (±) above {MAX_SPEED_SPREAD:.0%} of the "
                         "value: not a result.")
    return " ".join(sentences)


@dataclass(frozen=True)
class ColumnSpec:
    column: Column
    cell: Callable[[Runs], Cell]                       # the row's runs -> its cell
    shown: Callable[[Runs], bool] = lambda records: True  # all the table's records -> shown?
    caption: Callable[[Runs, list[Cell]], str] = lambda records, cells: ""  # -> a sentence


def _routed(records: Runs) -> bool:
    return any(_finite(r.get("active_params")) not in (None, _finite(r.get("params")))
               for r in records)


def _protocols_differ(records: Runs) -> bool:
    """Rows on one dataset evaluated differently (domains differing from each other do not
    count: ListOps has no windows, bytes do)."""
    seen = {(data_of(r), repr(sorted((r.get("eval_protocol") or {}).items()))) for r in records}
    return len(seen) > len({data for data, _ in seen})


def _attended(runs: Runs) -> Cell:
    return configured([{**r, "attended": _attended_percent(r)} for r in runs], "attended")


DENSE_PERCENT = 95.0
"""At or above this share of the pairs a sparse option is full attention (as a study's refusal
of such a row, :data:`xformer_bench.models.attended_pairs.DENSE`)."""


def _peak_memory_caption(records: Runs, cells: list[Cell]) -> str:
    """Why a row's Peak MiB is empty when it trained where a run's memory is not its own."""
    if not any(r["status"] == "finished" and str(r.get("peak_memory_kind")).startswith("cpu")
               for r in records):
        return ""
    return ("Peak MiB: — where the runs trained on a CPU (a process's resident set is not one "
            "run's memory); Step MiB is measured on every device.")


def _controls_caption(records: Runs, cells: list[Cell]) -> str:
    """The study's declared controls (``controls: {attention: [...]}``) that are full attention
    at its length: named, so their rows are read for quality, not for efficiency."""
    dense = sorted({r["config"]["attention"]["name"] for r in records
                    if (_attended_percent(r) or 0.0) >= DENSE_PERCENT
                    and r["config"].get("attention", {}).get("name")
                    in ((r["config"].get("controls") or {}).get("attention") or ())})
    if not dense:
        return ""
    return (f"Attended %: {', '.join(dense)} attend at least {DENSE_PERCENT:.0f} % of the pairs "
            "at this length -- full attention here, declared controls of the study: their rows "
            "compare quality, not efficiency.")


BEFORE_METRICS = (
    ColumnSpec(Column("params", "Params", kind="si"), lambda runs: configured(runs, "params")),
    ColumnSpec(Column("active_params", "Active params", kind="si"),
               lambda runs: configured(runs, "active_params"), _routed),
    ColumnSpec(Column("ops", "Ops", kind="si"), lambda runs: configured(runs, "flops_per_step")),
    ColumnSpec(Column("attended", "Attended %", digits=1), _attended,
               lambda records: any(_attended_percent(r) is not None for r in records),
               _controls_caption),
    ColumnSpec(Column("steps_per_sec", "Step/s", digits=2), _speed, caption=_speed_caption),
    ColumnSpec(Column("step_memory", "Step MiB", digits=1),
               lambda runs: configured(runs, "step_memory_mb"),
               lambda records: any(_finite(r.get("step_memory_mb")) is not None
                                   for r in records)),
    ColumnSpec(Column("peak_memory", "Peak MiB", digits=0),
               lambda runs: measured(runs, _per_run_memory),
               lambda records: any(r.get("peak_memory_kind") in PER_RUN_MEMORY
                                   for r in records), _peak_memory_caption),
    ColumnSpec(Column("early_loss", "Early loss", digits=3, higher_is_better=False),
               lambda runs: measured(runs, _loss_at("early"))),
    ColumnSpec(Column("final_loss", "Final loss", digits=3, higher_is_better=False),
               lambda runs: measured(runs, _loss_at("final"))),
)
AFTER_METRICS = (
    ColumnSpec(Column("eval_protocol", "Eval", kind="text"), _protocol, _protocols_differ),
    ColumnSpec(Column("seeds", "Seeds", kind="text"), _seeds),
)


def metric_spec(metric: Metric, runs_on: Callable[[str], Runs]) -> ColumnSpec:
    """The column of one test metric, on its own dataset's runs (``runs_on(data)``)."""
    return ColumnSpec(Column(metric.column_key, metric.title, digits=metric.spec.digits,
                             higher_is_better=metric.spec.higher_is_better),
                      lambda runs: measured(runs_on(metric.data), _metric_value(metric)))
