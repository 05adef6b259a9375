"""``xbench``: the Hydra entry point.  Thin: composes the config, hands each job to ``run_job``."""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import traceback
import warnings
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from xformer_bench.config import CONF_DIR
from xformer_bench.preflight import MULTIRUN_FLAGS, command_line_error, shown_only


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    return run_job(OmegaConf.to_container(cfg, resolve=True), dict(hydra_cfg.runtime.choices),
                   list(hydra_cfg.overrides.task), Path(hydra_cfg.runtime.output_dir),
                   multirun=hydra_cfg.mode == RunMode.MULTIRUN)


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
    kind, line, objective = _job(config, choices, overrides, run_dir, multirun)
    if report is not None:
        report.job_ends(kind, line)
    return objective


def _job(config: dict[str, Any], choices: dict[str, str], overrides: list[str], run_dir: Path,
         multirun: bool) -> tuple[str, str, float | None]:
    """(outcome kind -- :data:`xformer_bench.sweep_report.KINDS` --, its line, the objective)."""
    from xformer_bench.errors import XbenchError
    from xformer_bench.hardware import resolve_precision
    from xformer_bench.models.param_match import describe, match_params
    from xformer_bench.option_settings import apply_option_settings
    from xformer_bench.results.record import results_path, run_identity
    from xformer_bench.run_claim import claim_line, claimed
    from xformer_bench.schema import check_config, check_folders

    try:  # each job of a sweep: its own values, preset, data and folders (preflight: the first)
        config = apply_option_settings(config, overrides)  # a study's setting for this option
        check_config(config)  # what a study's sweep, option_settings and study_rows set, too
        check_folders(config)
        config = match_params(config, overrides)  # before the skip: d_ff is part of the run
    except XbenchError as error:
        _print_traceback_if_debugging()
        _fail(2, str(error), [], multirun)
        return "refused", str(error), None
    if config.get("match_params"):
        print(f"[xbench] {describe(config['match_params']['result'])}")
    config = resolve_precision(config)  # before the run id: auto on a CPU is 32-true
    record_path = results_path(config, run_identity(config, choices))
    with claimed(record_path) as owned:
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
        if done is not None:
            print(f"[xbench] skip {done['run_id']}: already finished "
                  f"({results_path(config, done['run_id'])})")
            return "skipped", "already finished", _objective(done)
    _announce(config, choices)
    try:
        record = execute(config, choices, overrides, run_dir)
    except RunInterrupted as error:
        _print_traceback_if_debugging()
        raise _interrupted(str(error), _recorded_as(config, choices, run_dir)) from None
    except XbenchError as error:
        _print_traceback_if_debugging()
        status, message, details = 2, str(error), _recorded_as(config, choices, run_dir)
    except Exception as error:  # noqa: BLE001 -- recorded by execute; reported here
        _print_traceback_if_debugging()
        status, message = 1, f"{type(error).__name__}: {error}"
        details = [*_recorded_as(config, choices, run_dir),
                   f"traceback: {_save_traceback(run_dir)}"]
    else:
        _report(record)
        return "finished", "", _objective(record)
    _fail(status, message, details, multirun)
    return ("failed" if details else "refused"), message, None


def _announce(config: dict[str, Any], choices: dict[str, str]) -> None:
    """What is about to train, before the first step: a newcomer sees the run start."""
    from xformer_bench.results.record import run_identity

    parts = ", ".join(f"{g}={choices[g]}" for g in ("model", "attention", "data") if choices.get(g))
    print(f"[xbench] training {run_identity(config, choices)} ({parts}): "
          f"{config['trainer']['max_steps']} steps, {config['trainer']['val_checks']} "
          "validations, the last at the end", flush=True)


def _interrupted(message: str, details: list[str]) -> SystemExit:
    """An interruption ends a sweep too: its ``error:`` line, recorded in the sweep's report;
    the exit to raise."""
    import xformer_bench.sweep_report as sweep_report

    report = sweep_report.current()
    if report is not None:
        report.job_ends("interrupted", message)
    _fail(2, message, details, multirun=True)
    return SystemExit(2)


def _fail(status: int, message: str, details: list[str], multirun: bool) -> None:
    """One ``error:`` line; a single run exits with ``status``, a sweep goes on."""
    print(f"error: {message}" + (f" ({'; '.join(details)})" if details else ""), file=sys.stderr)
    if not multirun:
        sys.exit(status)


def _print_traceback_if_debugging(error: BaseException | None = None) -> None:
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
    from xformer_bench.results.record import primary_metric

    spec = primary_metric(record)
    final, test = record.get("final") or {}, record.get("test") or {}
    print(
        f"[xbench] {record['run_id']}: final val {spec.name} "
        f"{final.get(spec.key('val'), float('nan')):.4f}"
        f" | test {spec.name} {test.get(spec.key('test'), float('nan')):.4f}"
        f" | {record['steps_per_sec']:.2f} steps/s, {record['tokens_per_sec']:,.0f} tokens/s"
        f" | {record['params']:,} params\n[xbench] record: {record['record_path']}"
    )


def _missing_launcher(argv: list[str]) -> str | None:
    """The one-line fix when a submitit launcher is asked for but its plugin is not installed."""
    choice = next((a.split("=", 1)[1] for a in argv if a.startswith("hydra/launcher=")), "")
    if not choice.startswith("submitit"):
        return None
    try:
        installed = importlib.util.find_spec("hydra_plugins.hydra_submitit_launcher") is not None
    except ModuleNotFoundError:
        installed = False
    return None if installed else (f"hydra/launcher={choice} needs hydra-submitit-launcher: "
                                   "pip install 'xformer_bench[slurm]'")


def _quiet_libraries() -> None:
    """Keep the terminal for xbench's own lines and the progress bar."""
    logging.getLogger("lightning.pytorch.utilities.rank_zero").setLevel(logging.WARNING)
    logging.getLogger("lightning.fabric.utilities.rank_zero").setLevel(logging.WARNING)
    logging.getLogger("lightning").propagate = False  # it has its own handler: no line twice
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    # Training data is indexed by step (data/step_datamodule.py): resuming mid-epoch is exact.
    warnings.filterwarnings("ignore", message=".*resuming from a checkpoint that ended before")
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    # Evaluation sums bytes and nats with torchmetrics across ranks before dividing.
    warnings.filterwarnings("ignore", message=".*sync_dist=True.*when logging on epoch level.*")
    # conf/hydra/launcher/submitit_slurm.yaml sets the plugin's schema of the same name.
    warnings.filterwarnings("ignore", message="(?s).*validated against ConfigStore schema")


def main() -> None:
    from xformer_bench.training.spawned_ranks import spawned_job

    _quiet_libraries()
    job = spawned_job()
    if job is not None:  # a DDP rank Lightning started: the parent's job, not a new one
        from xformer_bench.run import execute

        execute(**job)
        return
    problem = _missing_launcher(sys.argv[1:])
    if problem:
        sys.exit(f"error: {problem}")
    error = command_line_error(sys.argv[1:])  # a bad override: one line, not Hydra's several
    if error is not None:
        _print_traceback_if_debugging(error)
        _fail(2, str(error), [], multirun=False)
    _run_sweeps()


def _run_sweeps() -> None:
    """The command line's sweep, or a study's sweeps (its ablation ladders, or its published
    table's rows), one after another (:mod:`xformer_bench.ladder_sweeps`): every job counted
    first (``k/N``; ``--dry-run`` lists them and stops), the summary and the exit status at the
    end (:mod:`xformer_bench.sweep_report`)."""
    import xformer_bench.sweep_report as sweep_report
    from xformer_bench.errors import XbenchError
    from xformer_bench.ladder_sweeps import sweeps
    from xformer_bench.sweep_plan import DRY_RUN, dry_run_lines, planned_jobs
    from xformer_bench.swept_group_keys import held_for_jobs

    program, arguments = sys.argv[0], [a for a in sys.argv[1:] if a != DRY_RUN]
    multirun = any(a in MULTIRUN_FLAGS for a in arguments)
    dry_run = DRY_RUN in sys.argv or (multirun and bool(set(arguments) & {"--cfg", "-c"}))
    if dry_run:  # Hydra's --cfg shows one job: with -m, every job is listed instead
        arguments = shown_only(arguments)
    hydra_flag = any(a.startswith("-") and a not in MULTIRUN_FLAGS for a in arguments)
    try:
        planned = sweeps(arguments)
        counted = (dry_run or multirun) and not hydra_flag
        jobs = [planned_jobs(argv) if counted and argv is not None else [] for _, argv in planned]
        if dry_run:
            print("\n".join(dry_run_lines(planned, jobs)))
            return
    except XbenchError as error:
        _print_traceback_if_debugging()
        _fail(2, str(error), [], multirun=False)
        return
    if counted:
        sweep_report.begin([job for sweep_jobs in jobs for job in sweep_jobs])
    try:
        for title, argv in planned:
            if title:
                print(f"[xbench] {title}" + (f": xbench {' '.join(argv)}" if argv else ""),
                      flush=True)
            if argv is None:  # a planned row not run: its title says why
                continue
            sys.argv = [program, *held_for_jobs(argv)]  # a swept group's keys: set per job
            _main()
    finally:
        status = sweep_report.end()
    if status:
        sys.exit(status)


if __name__ == "__main__":
    main()
