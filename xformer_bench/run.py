"""One run: compose the pieces, train, evaluate, and write the run record -- whatever happens."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from xformer_bench.config import choice_groups
from xformer_bench.errors import ConfigError, DivergedError, UnmeasuredError, XbenchError
from xformer_bench.hardware import resolve_precision, trained_on
from xformer_bench.record_output import check_writable, write_or_keep
from xformer_bench.results import record as records
from xformer_bench.training.loggers import finish_logging
from xformer_bench.training.peak_memory import RunPeakMemory
from xformer_bench.training.preemption import RunInterrupted
from xformer_bench.training.spawned_ranks import shared_with_spawned_ranks
from xformer_bench.training.timing_conditions import MachineShare

FLOOR_DATASETS = ("text", "enwik8")
"""Byte-level text corpora: their records keep the n-gram floors the table sets beside them."""


def _build_datamodule(config: dict[str, Any]):
    from xformer_bench.registry import DATA

    datamodule = DATA.build(config["data"], seed=config["seed"],
                            data_dir=config["paths"]["data_dir"])
    stride = (config.get("eval") or {}).get("stride")
    if stride is not None and not hasattr(datamodule, "evaluate_with_stride"):
        raise ConfigError(f"eval.stride scores sliding windows of a sequence; data="
                          f"{config['data']['name']} is not one: remove eval.stride")
    if stride is not None:
        datamodule.evaluate_with_stride(stride)
    return datamodule


def _build_task(config: dict[str, Any], datamodule):
    """The task the datamodule names (``datamodule.task``), with its model; an unknown task
    is one ``error:`` line before the model is built."""
    from xformer_bench.tasks import TASK

    return TASK.get(datamodule.task)(config, datamodule)


def _stream_if_remembered(config: dict[str, Any], datamodule, model) -> None:
    """A stack that carries memory from batch to batch (``streams``) needs each batch row to
    continue the previous batch's: have the data stream its splits, evaluated per ``eval.tgt_len``
    / ``eval.lanes`` / ``eval.warm`` (Transformer-XL's protocol; checked for every run of data
    that can stream) with the layers and per-layer reach of the evaluation memory, which set a
    warmed lane's warm-up."""
    stack = getattr(model, "stack", None)
    remembers = getattr(stack, "streams", False)
    if hasattr(datamodule, "evaluate_streams"):
        keys = config.get("eval") or {}
        datamodule.evaluate_streams(keys.get("tgt_len"), keys.get("lanes"), keys.get("warm", False),
                                    depth=stack.n_layers if remembers else 0,
                                    reach=stack.eval_reach if remembers else 0)
    if not remembers:
        return
    if not hasattr(datamodule, "use_streams"):
        raise ConfigError(f"stack={config['stack']['name']} carries memory across batches, "
                          f"which needs streamed data; data={config['data']['name']} cannot "
                          "stream: choose another stack or data")
    datamodule.use_streams(memory=stack.eval_mem_len)


def build_task(config: dict[str, Any]):
    """The datamodule and the task (with its model) that ``config`` trains, the data streamed
    when the stack carries memory: what a run trains and the calibrated timing pass times."""
    datamodule = _build_datamodule(config)
    task = _build_task(config, datamodule)
    _stream_if_remembered(config, datamodule, task.model)
    return datamodule, task


def _resumable(config: dict[str, Any], run_id: str) -> tuple[str | None, Any, list]:
    """The checkpoint this run continues from (``resume=``; a wrong one is a ConfigError
    before anything runs), its resume points, and the callbacks that make stopping and
    resuming exact: resume points, signals, per-step random numbers."""
    from xformer_bench.training.checkpoints import RunCheckpoints, checkpoint_folder, resume_path
    from xformer_bench.training.preemption import Preemption
    from xformer_bench.training.step_seeds import StepSeeds
    from xformer_bench.training.validation_schedule import validation_steps

    identity = records.identity_config(config)
    resume = resume_path(config, run_id, identity)
    trainer = config["trainer"]
    checkpoints = RunCheckpoints(
        checkpoint_folder(config, run_id), periodic=config.get("resume") == "auto",
        every=trainer.get("checkpoint_every"), identity=identity,
        validation_steps=validation_steps(trainer["max_steps"], trainer["val_checks"]))
    preemption = Preemption(checkpoints.save, checkpoints.validates_at, checkpoints.periodic)
    return resume, checkpoints, [checkpoints, preemption, StepSeeds(config["seed"])]


def _ngram_floors(config: dict[str, Any], datamodule) -> dict[str, Any] | None:
    """A text corpus's n-gram floors at the run's window (:mod:`~.results.ngram_floors`),
    cached under ``paths.data_dir``; None for other data."""
    if config["data"]["name"] not in FLOOR_DATASETS or not hasattr(datamodule, "splits"):
        return None
    from xformer_bench.results.ngram_floors import run_floors

    return run_floors(datamodule.splits, config["data"]["seq_len"],
                      Path(config["paths"]["data_dir"]) / "ngram_floors")


def _compile(model, backend: bool | str | None) -> None:
    """``trainer.compile``: torch.compile the model's forward in place (state-dict keys, and so
    checkpoints, unchanged); ``true`` is inductor, a string names another backend."""
    if backend:
        model.compile(**({} if backend is True else {"backend": backend}))


def _startup(throughput, job_started: float) -> dict[str, float | None]:
    """Seconds to the first training step: from this job's start (a sweep's per-run overhead:
    data, model, probes -- ``probe_seconds`` of it, recorded apart --, trainer) and from the
    process's start (imports included); and the
    whole run's training time: from the process's start to the end of the last step, less the
    validations (``training_wall_seconds``: what a hand-written script's wall clock counts)."""
    from xformer_bench.training.throughput import process_started_at

    first, last = throughput.first_step_at, throughput.last_step_at
    if first is None:
        return {"setup_seconds": None, "startup_seconds": None, "training_wall_seconds": None}
    process = process_started_at()
    return {"setup_seconds": first - job_started,
            "startup_seconds": None if process is None else first - process,
            "training_wall_seconds": None if process is None or last is None else
            last - process - throughput.validation_seconds}


def _attention_coverage(config: dict[str, Any], model, task: str,
                        study: str | None) -> dict[str, Any] | None:
    """The pairs the model's attention attends at its length (``attention_coverage``, measured
    before training); in a study, a sub-quadratic row that attends nearly all of them is refused
    unless the study declares it a control
    (:func:`~xformer_bench.models.attended_pairs.refuse_dense`)."""
    from xformer_bench.models.attended_pairs import (attention_coverage, first_token_mixer,
                                                      refuse_dense)

    mixer = first_token_mixer(model)
    if mixer is None:
        return None
    dims = getattr(model, "dims", None)
    seq_len = getattr(dims, "seq_len", config["data"]["seq_len"])
    n_layers = getattr(dims, "n_layers", config["model"]["n_layers"])
    coverage = attention_coverage(mixer, seq_len, range(n_layers), causal=task != "classify",
                                  n_heads=config["model"]["n_heads"])
    refuse_dense(coverage, config["attention"], mixer, study=study, controls=config.get("controls"),
                 length=f"data.seq_len={config['data']['seq_len']}")
    return coverage


def _train(config: dict[str, Any], record: dict[str, Any], run_dir: Path,
           study: str | None = None) -> None:
    import lightning as L

    from xformer_bench.models.flops import training_step_flops
    from xformer_bench.training.step_memory import training_step_memory
    from xformer_bench.training.loggers import build_loggers, close_loggers
    from xformer_bench.training.progress_lines import ProgressLines
    from xformer_bench.training.throughput import Throughput
    from xformer_bench.training.checkpoints import discard
    from xformer_bench.training.final_weights import keep_final_weights
    from xformer_bench.training.trainer import build_trainer
    from xformer_bench.training.validation_schedule import validation_steps
    from xformer_bench.training.validation_history import ValidationHistory
    from xformer_bench.training.validation_subsample import ValidationSubsample

    job_started = time.time()
    resume, checkpoints, resumable = _resumable(config, record["run_id"])  # before anything runs
    L.seed_everything(config["seed"], workers=True, verbose=False)
    datamodule, task = build_task(config)
    record["data_fingerprint"] = getattr(datamodule, "data_fingerprint", None)  # a folder's files
    record["ngram_floors"] = _ngram_floors(config, datamodule)
    probing = time.perf_counter()  # the probes: attended pairs, FLOPs, step memory
    coverage = _attention_coverage(config, task.model, datamodule.task, study)  # may refuse
    probe_seconds = time.perf_counter() - probing
    record.update(records.task_fields(datamodule.task, task.metrics, task.unit))
    if hasattr(datamodule, "eval_protocol"):
        record["eval_protocol"] = datamodule.eval_protocol()
    if getattr(datamodule, "layout", None) is not None:  # images as sequences: (H, W, C)
        record["layout"] = list(datamodule.layout)
    seq_len, batch_size = config["data"]["seq_len"], config["data"]["batch_size"]
    record["attention_coverage"] = coverage
    record["params"] = task.model.num_parameters()
    record["active_params"] = task.model.num_active_parameters()
    probe = getattr(task.model, "example_inputs", None)  # inputs other than (B, T) tokens

    positions = getattr(getattr(task.model, "dims", None), "seq_len", seq_len)  # per example
    tokens_per_step = positions * batch_size * config["trainer"]["accumulate_grad_batches"]
    throughput, history = Throughput(tokens_per_step), ValidationHistory()
    subsample = ValidationSubsample(config["data"].get("val_subsample"), validation_steps(
        config["trainer"]["max_steps"], config["trainer"]["val_checks"])[-1])
    loggers = build_loggers(config["logger"], run_dir, record)
    lines = ProgressLines(record["run_id"], config["trainer"]["max_steps"],
                          records.primary_metric(record).key("val"))  # when no bar is shown
    trainer = build_trainer(config["trainer"], loggers,
                            [throughput, history, subsample, lines, *resumable], run_dir)
    probing = time.perf_counter()
    flops = training_step_flops(task.model, seq_len, batch_size, probe(1) if probe else None)
    # Each rank trains on its own batches, each step on accumulate_grad_batches of them.
    flops = flops.scaled(config["trainer"]["accumulate_grad_batches"] * trainer.world_size)
    record.update(flops_per_step=flops.total, flops_analytic=flops.analytic,
                  flops_uncounted=flops.uncounted,
                  step_memory_mb=training_step_memory(
                      task.model, seq_len, batch_size, getattr(datamodule, "vocab_size", 0),
                      probe(batch_size) if probe else None))
    record["probe_seconds"] = probe_seconds + time.perf_counter() - probing
    _compile(task.model, config["trainer"].get("compile"))  # after the probes above
    if trainer.global_rank == 0:  # what trains, once built: a newcomer sees the run start
        steps = validation_steps(config["trainer"]["max_steps"], config["trainer"]["val_checks"])
        print(f"[xbench] training {record['run_id']}: {record['params']:,} params, "
              f"{steps[-1]} steps on {config['data'].get('label', config['data']['name'])}, "
              f"validating after steps {', '.join(map(str, steps))}", flush=True)
    completed = False
    record["resumed_from"] = resume
    try:
        trainer.fit(task, datamodule=datamodule, ckpt_path=resume, weights_only=True)
        test = trainer.test(task, datamodule=datamodule, verbose=False)
        record["test"] = test[0] if test else None
        completed = True
        record["weights_path"] = keep_final_weights(config, record, trainer)  # keep_weights
        discard(checkpoints.folder)  # finished: the record is the result
    finally:
        max_steps = config["trainer"]["max_steps"]
        record.update(
            steps=trainer.global_step,
            steps_per_sec=throughput.steps_per_sec,
            tokens_per_sec=throughput.tokens_per_sec,
            validation_seconds=throughput.validation_seconds,
            **_startup(throughput, job_started),
            early=history.at_fraction(1 / 8, max_steps),
            final=history.points[-1] if history.points else None,
            final_step=history.points[-1]["step"] if history.points else None,
            history=history.points,
            eval_counts=dict(task.evaluated_units),
            val_subsample=subsample.report(),
            model_report=task.model.report(),
            **(task.record_fields() if hasattr(task, "record_fields") else {}),
        )
        close_loggers(loggers, failed=not completed)


def execute(config: dict[str, Any], choices: dict[str, str], overrides: list[str],
            run_dir: Path) -> dict[str, Any]:
    """Train and evaluate one configuration; the record is written even if training fails.

    Errors in the set-up (unknown variant, missing data) propagate before any record exists;
    a run that diverges, raises or is interrupted is recorded with that status, then re-raised;
    one that ends without measuring what it promised (:func:`~.records.unmeasured`) is recorded
    ``failed`` with the reason (:class:`UnmeasuredError`).
    """
    config = resolve_precision(config)  # before the run id: auto on a CPU is 32-true
    record = records.new_record(config, {g: choices.get(g) for g in choice_groups()},
                                overrides, run_dir)
    check_writable(config, record["run_id"])
    started = time.perf_counter()
    memory = RunPeakMemory()
    memory.start()
    machine = MachineShare(Path(config["paths"]["results_dir"])).start()  # alone or shared?
    try:
        with shared_with_spawned_ranks(config, choices, overrides, run_dir):
            _train(config, record, run_dir, study=choices.get("experiment"))
        reason = records.unmeasured(record)
        if reason is not None:  # trained to the end, yet measured nothing to compare
            record["error"] = f"the run did not measure what it promised: {reason}"
            raise UnmeasuredError(record["error"])
        record["status"] = "finished"
    except DivergedError as error:
        record.update(status="diverged", error=str(error))
        raise
    except RunInterrupted as error:
        record.update(status="interrupted", error=str(error))
        raise
    except XbenchError:
        raise  # a set-up error (nothing ran: no record), or nothing measured (recorded failed)
    except (KeyboardInterrupt, SystemExit) as error:
        record.update(status="interrupted", error=type(error).__name__)
        raise
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        raise
    finally:
        finish_logging(record)  # the outcome known: a W&B run's summary, then it closes
        if record["params"] is not None:  # the model was built: training started
            record["wall_time_sec"] = time.perf_counter() - started
            record["peak_memory_mb"], record["peak_memory_kind"] = memory.read()
            record["timing_conditions"] = machine.conditions()
            record["device"] = trained_on(config["trainer"])
            record["finished_at"] = records.now()
            write_or_keep(record, config)
    return record

