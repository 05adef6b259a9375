"""One job of ``xbench``: checked, skipped or claimed, trained, recorded, and reported -- its
outcome counted in the sweep's report (:mod:`xformer_bench.sweep_report`) and printed as one
``error:`` line when it did not finish."""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path
from typing import Any


def run_job(config: dict[str, Any], choices: dict[str, str], overrides: list[str], run_dir: Path,
            multirun: bool) -> float | None:
    """One job: refused when a value its study or sweep gave is out of range, its preset is for
    data of another shape or its folders cannot be written (:mod:`xformer_bench.schema`; a
    sweep's later jobs are checked here), skipped when already finished (``skip_completed``)
    or running in another process (:mod:`~xformer_bench.run_claim`), else trained and recorded.

    A failure prints one ``error:`` line; it ends a single run with a non-zero exit status
    (2 for xbench's own errors, 1 otherwise) but only this job of a sweep (``-m``: the sweep's
    summary names it and its exit status counts it) -- except an interruption (a signal,
    Ctrl-C), which ends the sweep too.
    """
    import xformer_bench.sweep_report as sweep_report

    report = sweep_report.current() if multirun else None
    if report is not None:
        report.job_starts(overrides)
    _stop_if_signalled()
    kind, line, objective = _job(config, choices, overrides, run_dir, multirun)
    if report is not None:
        report.job_ends(kind, line)
    return objective


def _speed(record: dict[str, Any]) -> str:
    """'5.60 steps/s, 11,469 tokens/s'; a run of one timed step or none (the first is warm-up,
    not timed: :mod:`~.training.throughput`) says so rather than print nan."""
    rate = record.get("steps_per_sec")
    if not isinstance(rate, (int, float)) or rate != rate:
        return "steps/s not timed (the first step is warm-up)"
    return f"{rate:.2f} steps/s, {record['tokens_per_sec']:,.0f} tokens/s"


def note_an_unswept_study(params: Any, experiment: str | None) -> None:
    """``xbench experiment=smoke`` (no ``-m``) runs one job of a study whose sweep (Hydra's
    ``sweeper.params``) has several: say so before it trains, rather than leave the study
    looking done."""
    jobs = 1
    for values in (params or {}).values():
        jobs *= len(values) if isinstance(values, (list, tuple)) else len(str(values).split(","))
    if jobs > 1:
        print(f"[xbench] note: experiment={experiment} sweeps {jobs} jobs; without -m this runs "
              "one (the study's defaults): add -m to run them all", flush=True)


def _stop_if_signalled() -> None:
    """A SIGTERM/SIGUSR1 held since an earlier job (:mod:`~.training.preemption`): the sweep
    ends here, before this job claims or trains anything."""
    import signal

    from xformer_bench.training.held_signals import held_signal

    held = held_signal()
    if held is not None:
        raise _interrupted(f"{signal.Signals(held).name} before this job started: the sweep "
                           "stopped here; run the same command to continue", [])


def _job(config: dict[str, Any], choices: dict[str, str], overrides: list[str], run_dir: Path,
         multirun: bool) -> tuple[str, str, float | None]:
    """(outcome kind -- :data:`xformer_bench.sweep_report.KINDS` --, its line, the objective)."""
    from xformer_bench.errors import XbenchError
    from xformer_bench.hardware import resolve_precision
    from xformer_bench.models.param_match import describe, match_params
    from xformer_bench.option_settings import apply_option_settings
    from xformer_bench.results.record import results_path, run_identity
    from xformer_bench.run_claim import claim_line, claimed, held_by_sibling
    from xformer_bench.schema import check_config, check_folders
    from xformer_bench.training.equal_compute import apply_equal_compute

    try:  # each job of a sweep: its own values, preset, data and folders (preflight: the first)
        config = apply_option_settings(config, overrides)  # a study's setting for this option
        check_config(config)  # what a study's sweep, option_settings and study_rows set, too
        check_folders(config)
        config = match_params(config, overrides)  # before the skip: d_ff is part of the run
        config = apply_equal_compute(config, overrides)  # after: d_ff changes a step's FLOPs
    except XbenchError as error:
        print_traceback_if_debugging()
        fail(2, str(error), [], multirun)
        return "refused", str(error), None
    if config.get("match_params"):
        print(f"[xbench] {describe(config['match_params']['result'])}")
    config = resolve_precision(config)  # before the run id: auto on a CPU is 32-true
    record_path = results_path(config, run_identity(config, choices))
    with claimed(record_path) as owned:
        if not owned and held_by_sibling(record_path):
            print(f"[xbench] skip {record_path.stem}: another worker of this sweep runs it")
            return "worker", "", None
        if not owned:
            line = f"running in another process: {claim_line(record_path)}"
            print(f"[xbench] skip {record_path.stem}: {line}")
            return "elsewhere", line, None
        return _claimed_job(config, choices, overrides, run_dir, multirun)


def _claimed_job(config: dict[str, Any], choices: dict[str, str], overrides: list[str],
                 run_dir: Path, multirun: bool) -> tuple[str, str, float | None]:
    from xformer_bench.errors import XbenchError
    from xformer_bench.results.record import finished_record, results_path
    from xformer_bench.run import execute
    from xformer_bench.training.preemption import RunInterrupted

    if config.get("skip_completed"):
        done = finished_record(config, choices)
        if done is not None and _folder_changed(config, done):
            print(f"[xbench] {done['run_id']}: data.path has changed since it finished "
                  "(files added, removed or rewritten): running it again")
            done = None
        if done is not None:
            print(f"[xbench] skip {done['run_id']}: already finished "
                  f"({results_path(config, done['run_id'])})")
            return "skipped", "already finished", _objective(done)
    try:
        record = execute(config, choices, overrides, run_dir)
    except RunInterrupted as error:
        print_traceback_if_debugging()
        raise _interrupted(str(error), _recorded_as(config, choices, run_dir)) from None
    except XbenchError as error:
        print_traceback_if_debugging()
        status, message, details = 2, str(error), _recorded_as(config, choices, run_dir)
    except Exception as error:  # noqa: BLE001 -- recorded by execute; reported here
        print_traceback_if_debugging()
        status, message = 1, f"{type(error).__name__}: {error}"
        details = [*_recorded_as(config, choices, run_dir),
                   f"traceback: {_save_traceback(run_dir)}"]
    else:
        _report(record)
        return ("resumed" if record.get("resumed_from") else "finished"), "", _objective(record)
    fail(status, message, details, multirun)
    return ("failed" if details else "refused"), message, None


def _folder_changed(config: dict[str, Any], done: dict[str, Any]) -> bool:
    """Whether the ImageFolder a finished run read (its record's ``data_fingerprint``) is no
    longer what ``data.path`` holds: the same configuration, other data."""
    recorded, path = done.get("data_fingerprint"), (config.get("data") or {}).get("path")
    if not recorded or not path or not Path(path).expanduser().is_dir():
        return False
    from xformer_bench.data.image_folder import folder_fingerprint

    return folder_fingerprint(path) != recorded


def _interrupted(message: str, details: list[str]) -> SystemExit:
    """An interruption ends a sweep too: its ``error:`` line, recorded in the sweep's report;
    the exit to raise."""
    import xformer_bench.sweep_report as sweep_report

    report = sweep_report.current()
    if report is not None:
        report.job_ends("interrupted", message)
    fail(2, message, details, multirun=True)
    return SystemExit(2)


def fail(status: int, message: str, details: list[str], multirun: bool) -> None:
    """One ``error:`` line; a single run exits with ``status``, a sweep goes on."""
    print(f"error: {message}" + (f" ({'; '.join(details)})" if details else ""), file=sys.stderr)
    if not multirun:
        sys.exit(status)


def print_traceback_if_debugging(error: BaseException | None = None) -> None:
    """With ``XBENCH_DEBUG=1``, the traceback of ``error`` (default: the one being handled) on
    stderr, above its ``error:`` line."""
    if os.environ.get("XBENCH_DEBUG", "0").lower() not in ("1", "true", "yes"):
        return
    if error is None:
        traceback.print_exc()
    else:
        traceback.print_exception(error)


def _save_traceback(run_dir: Path) -> Path:
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "error.log"
    log.write_text(traceback.format_exc())
    return log


def _recorded_as(config: dict[str, Any], choices: dict[str, str], run_dir: Path) -> list[str]:
    """``["recorded as <status>: <path>"]`` when this very run wrote a record, else ``[]``."""
    from xformer_bench.results import record as records
    from xformer_bench.results.record import results_path

    path = results_path(config, records.run_identity(config, choices))
    try:
        record = records.load(path)
    except (OSError, ValueError):
        return []
    return [f"recorded as {record['status']}: {path}"] if record["run_dir"] == str(run_dir) else []


def _objective(record: dict) -> float | None:
    """What a sweep optimises: the primary metric's final validation value (its direction is
    the spec's ``higher_is_better``)."""
    from xformer_bench.results.record import primary_metric

    spec = primary_metric(record)
    return (record.get("final") or {}).get(spec.key("val")) if spec else None


def _report(record: dict) -> None:
    from xformer_bench.results.late_rise import RISE, late_rise
    from xformer_bench.results.record import primary_metric

    spec = primary_metric(record)
    final, test = record.get("final") or {}, record.get("test") or {}
    print(
        f"[xbench] {record['run_id']}: final val {spec.name} "
        f"{final.get(spec.key('val'), float('nan')):.4f}"
        f" | test {spec.name} {test.get(spec.key('test'), float('nan')):.4f}"
        f" | {_speed(record)}"
        f" | {record['params']:,} params\n[xbench] record: {record['record_path']}"
    )
    rise = late_rise(record)
    if rise is not None:  # the final number is not where training had the model
        print(f"[xbench] warning: the last validation loss ({rise.last:.3f}, step "
              f"{rise.last_step}) is {rise.last / rise.lowest - 1:.0%} above its lowest "
              f"({rise.lowest:.3f}, step {rise.lowest_step}; more than {RISE:.0%}): "
              f"read the curve before the final number")
