"""results/ -> per experiment ``<out>/<experiment>.{tex,md,csv}`` and plots (``make table``)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from xformer_bench.errors import ConfigError, XbenchError
from xformer_bench.paper_rows import not_run_lines
from xformer_bench.results import confounds, csv_table, latex, layout, markdown, regression
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.collect import collect
from xformer_bench.results.ladder_render import write_ladder_tables
from xformer_bench.results.ladder_table import study_rows
from xformer_bench.results.late_rise import summary_line as late_rise_line
from xformer_bench.results.same_computation import summary_line as same_computation_line
from xformer_bench.results.same_numbers import summary_line as same_numbers_line
from xformer_bench.results.setups import Study, split_studies
from xformer_bench.results.speed import load_timings, with_calibration
from xformer_bench.results.variants import group_variants, repeated_seeds



def study_path(experiment: str) -> Path:
    """``conf/experiment/<experiment>.yaml`` (or a user config folder's): where a study
    declares its table's settings."""
    from xformer_bench.config import CONF_DIR, find_config

    return find_config("experiment", experiment) or CONF_DIR / "experiment" / f"{experiment}.yaml"


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


def table_baseline(experiment: str, records: Sequence[dict]) -> dict | None:
    """The baseline row a table marks significance against: the command line's when its runs
    were given one (``'baseline={activation: relu}'``, the same in every run that has it), else
    the study's declaration (:func:`study_baseline`: edited after the runs, it still counts),
    else the one every run's config holds (a study folder of the user's no longer there)."""
    import json

    def given(record: dict) -> bool:
        return any(str(o).lstrip("+~").startswith("baseline=")
                   for o in record.get("overrides") or [])

    def held(runs) -> set[str]:
        return {json.dumps(r["config"].get("baseline"), sort_keys=True) for r in runs
                if isinstance(r.get("config"), dict)}

    from_command_line = held(r for r in records if given(r))
    if len(from_command_line) == 1:
        return json.loads(from_command_line.pop())
    declared = study_baseline(experiment)
    if declared is not None:
        return declared
    recorded = held(records)
    return json.loads(recorded.pop()) if len(recorded) == 1 else None


def study_allowed_differences(experiment: str) -> tuple[str, ...]:
    """The differences from the baseline row a study accepts (``allowed_differences:
    [position, stack, eval_protocol]``: groups, dotted keys, ``eval_protocol``, ``params``)."""
    declared = _declared(experiment, "allowed_differences") or ()
    return (declared,) if isinstance(declared, str) else tuple(str(d) for d in declared)


def study_reference(experiment: str):
    """The published table a study is set beside (``reference: narang2021_table1``: a shipped
    :mod:`xformer_bench.references` table), or None; :class:`ConfigError` for one not shipped."""
    from xformer_bench.references import load, names

    name = _declared(experiment, "reference")
    if name and str(name) not in names():
        raise ConfigError(f"{study_path(experiment)} declares reference: {name}, no shipped "
                          f"reference table; shipped: {', '.join(names())}")
    return load(str(name)) if name else None


def study_columns(experiment: str) -> list[str] | None:
    """The columns a study's LaTeX table shows (``table_columns: [params, metric, delta, p]``),
    or None (:data:`layout.DEFAULT`)."""
    declared = _declared(experiment, "table_columns")
    return [str(c) for c in declared] if isinstance(declared, list) else None


class UnknownExperimentError(LookupError):
    """An experiment was asked for that no record belongs to."""


class NoRecordsError(XbenchError):
    """No valid run record under the results folder."""


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def make_tables(results_dir: Path, out_dir: Path, experiments: Sequence[str] = (),
                plots: bool = True, log: Callable[[str], None] = _stderr,
                allow_empty: bool = False, columns: Sequence[str] | None = None,
                latex_float: str = "table") -> list[Path]:
    """Write the tables (and plots) of ``experiments`` (default: all); return the files.  The
    shipped references' records (``<results_dir>/reference/``) are not this results folder's
    runs: each reference is its own results folder (``make references`` renders each).  An
    experiment's runs on another dataset at another scale get a table of their own, named in
    one warning (:func:`~xformer_bench.results.setups.split_studies`).  No valid record is
    :class:`NoRecordsError`, but with ``allow_empty`` when there is no record at all (one
    ``log`` line, nothing written).  ``columns``: the LaTeX table's, over each study's
    ``table_columns``; ``latex_float``: ``table`` or ``table*``."""
    results_dir, out_dir = Path(results_dir), Path(out_dir)
    tables = () if results_dir.resolve().is_relative_to(out_dir.resolve()) else (out_dir,)
    exclude = (*tables, results_dir / "tables", results_dir / "reference")
    found = collect(results_dir, exclude=exclude)
    for skipped in found.skipped:
        log(f"skipped {skipped.path}: {skipped.reason}")
    for path in found.duplicates:
        log(f"skipped {path}: an older record of the same run_id")
    if found.foreign:
        folders = sorted({str(path.parent) for path in found.foreign})
        log(f"ignored {len(found.foreign)} JSON file(s) that are no run records (no schema, "
            f"no run_id) in {', '.join(folders)}")
    if not found.records:
        if allow_empty and not found.skipped:
            log(f"no run records under {results_dir} yet: no tables to make (train first: "
                "`xbench`, or `xbench -m experiment=<study>`)")
            return []
        raise NoRecordsError(f"no valid run records under {results_dir}"
                             + (f" ({len(found.skipped)} skipped, named above)"
                                if found.skipped else ""))
    unknown = sorted(set(experiments) - set(found.experiments()))
    if unknown:
        raise UnknownExperimentError(
            f"no records for experiment(s) {unknown} under {results_dir}; "
            f"found {found.experiments()}")
    timings = load_timings(results_dir, log, exclude)
    written: list[Path] = []
    out_dir.mkdir(parents=True, exist_ok=True)
    for experiment in sorted(experiments or found.experiments()):
        main, *apart = split_studies(experiment, found.of(experiment))
        for study in apart:  # another dataset at another scale: not beside the study's
            log(f"warning: {experiment}: {study.apart}: not set beside them; "
                f"their own table, {study.name}")
        for study in (main, *apart):
            written += _study_tables(experiment, study, study is main, out_dir,
                                     timings.get(experiment, {}), results_dir, plots, log,
                                     (columns or study_columns(experiment), latex_float))
    return written


def _study_tables(experiment: str, study: Study, whole: bool, out_dir: Path,
                  timing: dict, results_dir: Path, plots: bool,
                  log: Callable[[str], None], latex_options: tuple = (None, "table"),
                  ) -> list[Path]:
    """The files of one study's table; ``whole``: the experiment's own (with its paper
    reference, rows not run, regression guard and ladders), else runs set apart from it."""
    rows = study_rows(study.records)  # a ladder's inner rungs: its ladder table
    variants = group_variants(with_calibration(rows, timing))  # Step/s: timing.json
    for warning in repeated_seeds(variants):
        log(f"warning: {study.name}: {warning}")
    paper = study_reference(experiment) if whole else None
    table = build_table(study.name, variants, table_baseline(experiment, study.records),
                        study_allowed_differences(experiment), paper)
    if whole:
        table = replace(table, summary=(*table.summary, *not_run_lines(experiment, rows)))
    elif study.apart:  # the table says why it is not the experiment's
        table = replace(table, summary=(f"Not in the {experiment} table: {study.apart}.",
                                        *table.summary))
    for line in (same_computation_line(variants),  # rows that are one model under two names
                 same_numbers_line(variants),  # rows that computed the same numbers anyway
                 late_rise_line(variants)):  # rows whose final number is not their training's
        if line:
            log(f"warning: {study.name}: {line}")
            table = replace(table, summary=(*table.summary, line))
    for row in table.rows:  # one line per row that differs in what the study did not declare
        line = confounds.warning(study.name, row.label, list(row.differences))
        if line:
            log(f"warning: {line}")
    base = out_dir / study.name.replace("/", "_")
    written: list[Path] = []
    names, latex_float = latex_options  # CSV: the full table; Markdown: Δ and p added
    texts = {"md": markdown.render(layout.with_tests(table, study.records, paper)),
             "tex": latex.render(layout.layout(table, names, study.records, paper), latex_float),
             "csv": csv_table.render(table)}
    for suffix, text in texts.items():
        path = base.with_name(f"{base.name}.{suffix}")
        path.write_text(text, encoding="utf-8", newline="\n")
        written.append(path)
    expected = regression.expected_path(results_dir)  # a shipped reference's guard
    if whole and expected is not None:
        moved, recorded = regression.guard(table, expected)
        for line in moved:
            log(f"warning: {line}")
        written += [expected] if recorded else []
    if whole:
        written += write_ladder_tables(experiment, study.records, base,  # its ladders
                                       _declared(experiment, "ladders"),
                                       study_baseline(experiment), log)
    if plots:
        from xformer_bench.results.plots import write_plots

        written += write_plots(table, variants, base)
    return written
