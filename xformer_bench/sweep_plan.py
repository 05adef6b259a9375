"""The jobs a command line runs, before any of them runs: ``k/N`` progress, ``--dry-run`` and the
check of every swept value (a study's ``sweep:`` included) all count the same list.

Each job's overrides are made as Hydra's basic sweeper makes them: the composed
``hydra.sweeper.params`` (a study's ``sweep:``), then the command line (its value wins, in the
place the study gave the key), crossed.  A command line without ``-m`` is one job.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from xformer_bench.config import initialize_conf
from xformer_bench.errors import ConfigError
from xformer_bench.paper_rows import key_of, one_job
from xformer_bench.preflight import MULTIRUN_FLAGS


def task_arguments(argv: Sequence[str]) -> list[str]:
    """``argv`` less the multirun flag and Hydra's own keys: what a job's overrides come from."""
    return [a for a in argv if a not in MULTIRUN_FLAGS and not key_of(a).startswith("hydra")]


def swept_parameters(argv: Sequence[str]) -> dict[str, str]:
    """The composed ``hydra.sweeper.params`` of ``argv`` (a study's ``sweep:``), as strings."""
    from hydra import compose
    from omegaconf import OmegaConf

    with _hydra():
        try:
            config = compose(config_name="config", overrides=one_job(argv),
                             return_hydra_config=True)
        except Exception as error:  # noqa: BLE001 -- the preflight names composition errors
            raise ConfigError(f"cannot compose {' '.join(one_job(argv))}: "
                              f"{str(error).splitlines()[0]}") from error
        node = config.hydra.sweeper.get("params")
        params = OmegaConf.to_container(node, resolve=True) if node is not None else {}
    return {str(k): _as_text(v) for k, v in params.items()}


def _as_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return "null" if value is None else str(value)


def planned_jobs(argv: Sequence[str]) -> list[list[str]]:
    """Every job's overrides, in the order Hydra runs them; :class:`ConfigError` (one line) for a
    sweep Hydra could not enumerate."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    arguments = task_arguments(argv)
    if not any(a in MULTIRUN_FLAGS for a in argv):
        return [arguments]
    params = [f"{k}={v}" for k, v in swept_parameters(argv).items()]
    with _hydra():
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        try:
            overrides = parser.parse_overrides([*params, *arguments])
            [jobs] = BasicSweeper.split_arguments(overrides, None)
        except HydraException as error:
            raise ConfigError(f"cannot enumerate the sweep {' '.join(params + arguments)}: "
                              f"{str(error).splitlines()[0]}") from error
    return jobs


def study_sweeps(argv: Sequence[str]) -> list[str]:
    """The study's swept keys as ``key=a,b`` overrides (for the preflight to check each value)."""
    if not any(a in MULTIRUN_FLAGS for a in argv):
        return []
    given = {key_of(a) for a in task_arguments(argv)}
    return [f"{k}={v}" for k, v in swept_parameters(argv).items() if k not in given]


class _hydra:
    """Hydra's global state initialised on ``conf/`` and the user's config folders
    (:func:`xformer_bench.config.initialize_conf`) for the block, unless it already is."""

    def __enter__(self) -> None:
        from hydra.core.global_hydra import GlobalHydra

        self._context = None
        if not GlobalHydra.instance().is_initialized():
            self._context = initialize_conf()
            self._context.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._context is not None:
            self._context.__exit__(*exc)


DRY_RUN = "--dry-run"
"""``xbench -m experiment=X --dry-run``: every planned job, nothing trained."""


SEED = re.compile(r"seed=(-?\d+)")
"""A job's seed override, split off so jobs that differ only in it share their composition."""


class JobPlanner:
    """What :func:`xformer_bench.job.run_job` would do with each job's overrides, through the
    checks it makes.  Jobs that differ only in ``seed=N`` share the Hydra composition (the seed
    is set before the config resolves, so an interpolated ``${seed}`` follows it) and, where
    their resolved configs are equal but for the seed, the parameter match (parameter counts do
    not depend on the seed): a 3-seed study composes and matches each row once."""

    def __init__(self) -> None:
        self._composed: dict[tuple[str, ...], tuple[Any, dict[str, str]]] = {}
        self._matched: dict[tuple[str, tuple[str, ...]], dict] = {}

    def plan(self, overrides: Sequence[str]) -> tuple[str | None, str, dict | None]:
        """(run id, ``run``, ``skip: already finished`` or ``refused: <line>``, the resolved
        config or None when refused)."""
        from xformer_bench.errors import XbenchError
        from xformer_bench.hardware import resolve_precision
        from xformer_bench.option_settings import apply_option_settings
        from xformer_bench.results.record import finished_record, run_identity
        from xformer_bench.schema import check_config
        from xformer_bench.training.equal_compute import apply_equal_compute

        seeds = [int(m.group(1)) for m in map(SEED.fullmatch, overrides) if m]
        rest = tuple(o for o in overrides if not SEED.fullmatch(o))
        config, choices = self._compose(rest, seeds[-1] if seeds else None)
        try:
            config = apply_option_settings(config, list(overrides))
            check_config(config)
            config = resolve_precision(apply_equal_compute(self._match(config, rest, overrides),
                                                           list(overrides)))
        except XbenchError as error:
            return None, f"refused: {error}", None
        finished = config.get("skip_completed") and finished_record(config, choices)
        return (run_identity(config, choices), "skip: already finished" if finished else "run",
                config)

    def _compose(self, rest: tuple[str, ...], seed: int | None) -> tuple[dict, dict[str, str]]:
        import copy

        from hydra import compose
        from omegaconf import OmegaConf, open_dict

        if rest not in self._composed:
            with _hydra():
                composed = compose(config_name="config", overrides=list(rest),
                                   return_hydra_config=True)
            choices = {k: v for k, v in composed.hydra.runtime.choices.items()
                       if "/" not in k and "@" not in k}
            with open_dict(composed):
                del composed["hydra"]
            self._composed[rest] = composed, choices
        composed, choices = self._composed[rest]
        composed = copy.deepcopy(composed)
        if seed is not None:
            composed.seed = seed
        return OmegaConf.to_container(composed, resolve=True), choices

    def _match(self, config: dict, rest: tuple[str, ...], overrides: Sequence[str]) -> dict:
        import copy
        import json

        from xformer_bench.models.param_match import match_params

        unseeded = json.dumps({k: v for k, v in config.items() if k != "seed"},
                              sort_keys=True, default=str)
        key = (unseeded, rest)
        if key not in self._matched:
            self._matched[key] = match_params(config, list(overrides))
        return {**copy.deepcopy(self._matched[key]), "seed": config.get("seed")}


def dry_run_lines(planned: Sequence[tuple[str | None, list[str] | None]],
                  jobs: Sequence[list[list[str]]]) -> list[str]:
    """What ``--dry-run`` prints: each planned sweep's title, then each of its jobs -- number,
    overrides, run id and what a run would do -- and the totals."""
    from xformer_bench.results.same_computation import planned_rows, summary_line
    from xformer_bench.schema.data import task_of

    total, number, lines, states, runs = sum(map(len, jobs)), 0, [], [], []
    planner = JobPlanner()
    for (title, argv), sweep_jobs in zip(planned, jobs):
        if title:
            lines.append(f"[xbench] {title}" + (f": xbench {' '.join(argv)}" if argv else ""))
        for overrides in sweep_jobs:
            number += 1
            run_id, state, config = planner.plan(overrides)
            states.append(state.split(":")[0])
            lines.append(f"  {number}/{total} {' '.join(overrides) or '(defaults)'}\n"
                         f"      {run_id or '-'}: {state}")
            if config is not None:  # a row: its paper row, else its overrides but the seed
                label = config.get("paper_row") or " ".join(
                    o for o in overrides if not o.startswith("seed=")) or "(defaults)"
                runs.append((str(label), config, task_of(config["data"])))
    counts = {s: states.count(s) for s in ("run", "skip", "refused")}
    first = next((job for sweep_jobs in jobs for job in sweep_jobs), None)
    lines += budget_lines(first) if first is not None else []
    same = summary_line(planned_rows(runs))
    lines += [f"[xbench] warning: {same}"] if same else []
    lines.append(f"[xbench] dry run: {total} jobs: {counts['run']} to run, {counts['skip']} "
                 f"already finished, {counts['refused']} refused; nothing trained")
    return lines


def budget_lines(overrides: Sequence[str]) -> list[str]:
    """The budget this command trains each run for (the first job's), and the study's GPU
    budget (its ``gpu_budget``: the overrides that scale it to a GPU) as a command to paste."""
    from hydra import compose

    with _hydra():
        config = compose(config_name="config", overrides=list(overrides),
                         return_hydra_config=True)
    data, steps = config.data, config.trainer.max_steps
    study = config.hydra.runtime.choices.get("experiment")
    lines = [f"[xbench] budget: {steps} steps of {data.batch_size} x {data.seq_len} "
             f"({steps * data.batch_size * data.seq_len:,} positions) a run"]
    gpu = config.get("gpu_budget")
    if gpu:
        lines.append(f"[xbench] GPU budget: xbench -m experiment={study} " + " ".join(gpu))
    return lines
