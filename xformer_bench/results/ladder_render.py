"""A study's ladder tables (:mod:`ladder_table`) as files next to its table:
``<experiment>_ladders.md`` (one table per ladder, rung by rung, with a note saying how each
column is computed) and ``<experiment>_ladders.csv`` (full precision, uncorrected p-values)."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xformer_bench.results.ladder_table import LadderTable, Step, ladder_systems, ladder_table
from xformer_bench.results.markdown import STYLE, escape
from xformer_bench.results.significance import ALPHA
from xformer_bench.results.table import Column, cell_text


def rung_label(table: LadderTable, step: Step) -> str:
    """'model=vanilla', '+position=xl_relative', '+eval.lanes=10 (= model=transformer_xl)'."""
    last = step is table.steps[-1] and step.rung.index > 0
    return step.rung.name + (f" (= {step.rung.overrides[0]})" if last else "")


def _signed(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:+.{digits}f}"


def _share(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.1f} %"


def note(table: LadderTable) -> str:
    digits, spec = table.metric.spec.digits, table.metric.spec
    direction = "higher" if spec.higher_is_better else "lower"
    total = ("not yet measured" if table.total is None
             else f"{table.total:.{digits}f} {table.metric.title}")
    steps = len(table.steps) - 1
    counted = f"{steps} steps" if steps != 1 else "1 step"
    return (f"{table.system} against {table.baseline}, one change at a time: total gain "
            f"{total} ({direction} is better); Gain: each rung's gain "
            f"over the rung above; Share: its part of the total gain (the shares sum to "
            f"100 %); mean ± std (sample) over finished seeds; p: Welch's t-test against the "
            f"rung above over seeds, uncorrected; †: significant after Holm-Bonferroni "
            f"correction over the ladder's {counted} (family-wise p < {ALPHA}), never "
            f"when the step is below the rung above's seed-to-seed std; —: not measured.")


def render_markdown(tables: list[LadderTable]) -> str:
    lines: list[str] = []
    for table in tables:
        column = Column("metric", table.metric.title, digits=table.metric.spec.digits)
        lines += [f"## {escape(table.experiment)}: ablation ladder of {escape(table.system)}", "",
                  f"| Rung | {escape(table.metric.title)} | Gain | Share | p | Seeds |",
                  "|:---|---:|---:|---:|---:|---:|"]
        for step in table.steps:
            gain = _signed(step.gain, column.digits) + ("†" if step.significant else "")
            p = "—" if step.p_value is None else f"{step.p_value:.2g}"
            lines.append(f"| {escape(rung_label(table, step))} | "
                         f"{cell_text(step.cell, column, STYLE)} | {gain} | "
                         f"{_share(step.share)} | {p} | {step.seeds.text or '—'} |")
        lines += ["", escape(note(table)), ""]
    return "\n".join(lines)


def render_csv(tables: list[LadderTable]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["system", "rung", "name", "overrides", "metric", "mean", "std", "n", "gain",
                     "share", "p_value", "significant", "seeds"])
    for table in tables:
        for step in table.steps:
            writer.writerow([table.preset, step.rung.index, step.rung.name,
                             " ".join(step.rung.overrides), table.metric.title,
                             *("" if v is None else repr(v) for v in
                               (step.cell.mean, step.cell.std, step.cell.n, step.gain,
                                step.share, step.p_value)),
                             str(step.significant).lower(), step.seeds.text or ""])
    return out.getvalue()


def write_ladder_tables(experiment: str, records: list[dict[str, Any]], base: Path,
                        declared: Any, baseline: dict | None,
                        log: Callable[[str], None]) -> list[Path]:
    """``<base>_ladders.{md,csv}`` for the ladders of ``experiment`` (declared ``ladders:`` or
    the presets its runs were made for); ``[]`` when it has none."""
    from xformer_bench.errors import ConfigError
    from xformer_bench.ladder import DEFAULT_BASELINE, ladder
    from xformer_bench.results.variants import group_variants

    systems = ladder_systems(records, declared)
    if not systems:
        return []
    variants = group_variants(records)
    start = str((baseline or {}).get("model") or DEFAULT_BASELINE)
    tables = []
    for system in systems:
        try:
            chain = ladder(system, start, experiment)
        except ConfigError as error:
            log(f"warning: {experiment}: {error}")
            continue
        table = ladder_table(experiment, chain, variants, experiment)
        if table is not None:
            tables.append(table)
    if not tables:
        return []
    written = []
    for suffix, render in (("md", render_markdown), ("csv", render_csv)):
        path = base.with_name(f"{base.name}_ladders.{suffix}")
        path.write_text(render(tables), encoding="utf-8", newline="\n")
        written.append(path)
    return written
