"""results/ -> per experiment ``<out>/<experiment>.{tex,md,csv}`` and plots (``make table``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from xformer_bench.paper_rows import not_run_lines
from xformer_bench.results import confounds, csv_table, latex, markdown, regression
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.ladder_render import write_ladder_tables
from xformer_bench.results.ladder_table import study_rows
from xformer_bench.results.speed import load_timing, with_calibration
from xformer_bench.results.variants import group_variants, repeated_seeds

RENDERERS = {"md": markdown.render, "tex": latex.render, "csv": csv_table.render}


def study_path(experiment: str) -> Path:
    """``conf/experiment/<experiment>.yaml``: where a study declares its table's settings."""
    from xformer_bench.config import CONF_DIR

    return CONF_DIR / "experiment" / f"{experiment}.yaml"


def _declared(experiment: str, key: str):
    from omegaconf import OmegaConf

    path = study_path(experiment)
    if not path.is_file():
        return None
    declared = OmegaConf.load(path).get(key)
    return OmegaConf.to_container(declared) if OmegaConf.is_config(declared) else declared


def study_baseline(experiment: str) -> dict | None:
    """The baseline row a study declares (``baseline: {activation: relu}`` in
    ``conf/experiment/<experiment>.yaml``), or None."""
    return _declared(experiment, "baseline")


def study_allowed_differences(experiment: str) -> tuple[str, ...]:
    """The differences from the baseline row a study accepts (``allowed_differences:
    [position, stack, eval_protocol]``: groups, dotted keys, ``eval_protocol``, ``params``)."""
    declared = _declared(experiment, "allowed_differences") or ()
    return (declared,) if isinstance(declared, str) else tuple(str(d) for d in declared)


def study_reference(experiment: str):
    """The published table a study is set beside (``reference: narang2021_table1``: a shipped
    :mod:`xformer_bench.references` table), or None."""
    from xformer_bench.references import load

    name = _declared(experiment, "reference")
    return load(str(name)) if name else None


class UnknownExperimentError(LookupError):
    """An experiment was asked for that no record belongs to."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def make_tables(results_dir: Path, out_dir: Path, experiments: Sequence[str] = (),
                plots: bool = True, log: Callable[[str], None] = _stderr) -> list[Path]:
    """Write the tables (and plots) of ``experiments`` (default: all); return the files.  The
    shipped references' records (``<results_dir>/reference/``) are not this results folder's
    runs: each reference is its own results folder (``make table`` renders each)."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    tables = () if results_dir.resolve().is_relative_to(out_dir.resolve()) else (out_dir,)
    found = collect(results_dir, exclude=(*tables, results_dir / "tables",
                                          results_dir / "reference"))
    for skipped in found.skipped:
        log(f"skipped {skipped.path}: {skipped.reason}")
    for path in found.duplicates:
        log(f"skipped {path}: an older record of the same run_id")
    unknown = sorted(set(experiments) - set(found.experiments()))
    if unknown:
        raise UnknownExperimentError(
            f"no records for experiment(s) {unknown} under {results_dir}; "
            f"found {found.experiments()}")
    written: list[Path] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for experiment in sorted(experiments or found.experiments()):
        rows = study_rows(found.of(experiment))  # a ladder's inner rungs: its ladder table
        variants = group_variants(with_calibration(rows,  # Step/s: timing.json
                                                   load_timing(results_dir, experiment)))
        for warning in repeated_seeds(variants):
            log(f"warning: {experiment}: {warning}")
        table = build_table(experiment, variants, study_baseline(experiment),
                            study_allowed_differences(experiment), study_reference(experiment))
        table = replace(table, summary=(*table.summary, *not_run_lines(experiment, rows)))
        for row in table.rows:  # one line per row that differs in what the study did not declare
            line = confounds.warning(experiment, row.label, list(row.differences))
            if line:
                log(f"warning: {line}")
        base = out_dir / experiment.replace("/", "_")
        for suffix, render in RENDERERS.items():
            path = base.with_name(f"{base.name}.{suffix}")
            path.write_text(render(table), encoding="utf-8", newline="\n")
            written.append(path)
        expected = regression.expected_path(results_dir)  # a shipped reference's guard
        if expected is not None:
            moved, recorded = regression.guard(table, expected)
            for line in moved:
                log(f"warning: {line}")
            written += [expected] if recorded else []
        written += write_ladder_tables(experiment, found.of(experiment), base,  # its ladders
                                       _declared(experiment, "ladders"),
                                       study_baseline(experiment), log)
        if plots:
            from xformer_bench.results.plots import write_plots

            written += write_plots(table, variants, base)
    return written
