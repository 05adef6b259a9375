"""``xbench``: the Hydra entry point.  Thin: checks the command line, plans its sweeps, composes
each job's config and hands it to :func:`xformer_bench.job.run_job`."""

from __future__ import annotations

import importlib.util
import logging
import sys
import warnings
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from xformer_bench.config import (CONF_DIR, add_user_conf, check_user_conf, register_user_conf,
                                  take_config_dirs)
from xformer_bench.errors import ConfigError
from xformer_bench.job import fail, note_an_unswept_study, print_traceback_if_debugging, run_job
from xformer_bench.parallel_sweep import FLAG as WORKERS_FLAG
from xformer_bench.parallel_sweep import run_workers, split_workers
from xformer_bench.preflight import MULTIRUN_FLAGS, command_line_error, shown_only
from xformer_bench.sweep_plan import DRY_RUN


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def _main(cfg: DictConfig) -> float | None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if not multirun:
        note_an_unswept_study(OmegaConf.to_container(hydra_cfg.sweeper, resolve=True).get(
            "params"), hydra_cfg.runtime.choices.get("experiment"))
    return run_job(OmegaConf.to_container(cfg, resolve=True), dict(hydra_cfg.runtime.choices),
                   list(hydra_cfg.overrides.task), Path(hydra_cfg.runtime.output_dir),
                   multirun=multirun)


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
    from xformer_bench.training.held_signals import hold_signals
    from xformer_bench.training.spawned_ranks import run_spawned_rank, spawned_job

    hold_signals()  # a signal before training starts still ends in a record and a clean stop
    _quiet_libraries()
    job = spawned_job()
    if job is not None:  # a DDP rank Lightning started: the parent's job, not a new one
        run_spawned_rank(job)
        return
    problem = _missing_launcher(sys.argv[1:])
    if problem:
        sys.exit(f"error: {problem}")
    try:  # --config-dir X: into XBENCH_CONF, which the preflight, the planner, Hydra (through
        # register_user_conf) and the --workers processes all read; Hydra then needs no flag
        folders, arguments = take_config_dirs(sys.argv[1:])
        add_user_conf(folders)
        check_user_conf()
        workers, arguments = split_workers(arguments)
        if workers is not None and not set(arguments) & set(MULTIRUN_FLAGS):
            raise ConfigError(f"{WORKERS_FLAG} shares a sweep's jobs among processes: add -m")
    except ConfigError as error:
        fail(2, str(error), [], multirun=False)
    error = command_line_error(arguments)  # a bad override: one line, not Hydra's several
    if error is not None:
        print_traceback_if_debugging(error)
        fail(2, str(error), [], multirun=False)
    if workers is not None and DRY_RUN not in arguments and workers > 1:
        sys.exit(run_workers(arguments, workers))
    register_user_conf()  # @hydra.main searches the user folders too
    sys.argv = [sys.argv[0], *arguments]
    _run_sweeps()


def _run_sweeps() -> None:
    """The command line's sweep, or a study's sweeps (its ablation ladders, or its published
    table's rows), one after another (:mod:`xformer_bench.ladder_sweeps`): every job counted
    first (``k/N``; ``--dry-run`` lists them and stops), the summary and the exit status at the
    end (:mod:`xformer_bench.sweep_report`)."""
    import xformer_bench.sweep_report as sweep_report
    from xformer_bench.errors import XbenchError
    from xformer_bench.ladder_sweeps import sweeps
    from xformer_bench.sweep_plan import dry_run_lines, planned_jobs
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
        print_traceback_if_debugging()
        fail(2, str(error), [], multirun=False)
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
