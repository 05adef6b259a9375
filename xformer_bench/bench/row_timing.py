"""The calibrated timing pass: each row of a study timed under control (``make time-rows``).

Each row -- each distinct configuration less its seed
(:func:`~xformer_bench.results.speed.row_identity`) -- is rebuilt from one of its records'
resolved config and timed through the training path a run takes
(:func:`~xformer_bench.run.build_task`, the run's Lightning trainer, its
:class:`~xformer_bench.training.throughput.Throughput`; validation off): one warm-up round,
then ``repeats`` rounds of ``steps`` timed steps, the rows round-robin within each round so
that slow drift of the machine hits every row alike.  ``timing.json``, beside the study's
records, holds per row the median steps/s over the rounds, its interquartile range and the
spread (IQR / median), and the machine's conditions over the pass
(:mod:`~xformer_bench.training.timing_conditions`).

    python -m xformer_bench.bench.row_timing --results-dir results --experiment systems_lm
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from xformer_bench.results.collect import TIMING_FILE, collect
from xformer_bench.results.record import now, write_json_atomic
from xformer_bench.results.speed import row_identity
from xformer_bench.results.variants import group_variants


def rows_of(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """One record per row identity (a finished one first, then the lowest seed), with its
    table row's label (``"label"``) and its runs (``"run_ids"``)."""
    labels = {r["run_id"]: v.label for v in group_variants(records) for r in v.records}
    rows: dict[str, dict[str, Any]] = {}
    for record in sorted(records, key=lambda r: (r["status"] != "finished", str(r["seed"]))):
        row = rows.setdefault(row_identity(record["config"]),
                              {"record": record, "label": labels[record["run_id"]],
                               "run_ids": []})
        row["run_ids"].append(record["run_id"])
    return rows


def timing_trainer(trainer: dict[str, Any], steps: int) -> dict[str, Any]:
    """The run's ``trainer`` node for one timed fit: ``steps`` timed steps after the first
    (which :class:`Throughput` leaves out), no validation, checkpoint or progress bar."""
    return {**trainer, "max_steps": steps + 1, "val_checks": 1, "limit_val_batches": 0,
            "checkpoint": False, "progress_bar": False}


def summarize_rates(rates: list[float]) -> dict[str, Any]:
    """Median steps/s over the rounds, its interquartile range and the spread IQR / median."""
    median = statistics.median(rates)
    q1, _, q3 = (statistics.quantiles(rates, n=4, method="inclusive") if len(rates) > 1
                 else (rates[0],) * 3)
    return {"steps_per_sec": median, "iqr": q3 - q1,
            "spread": (q3 - q1) / median if median else None, "rates": rates}


class TimedRow:
    """A row built once (data, task, model) and timed fit after fit."""

    def __init__(self, config: dict[str, Any], steps: int, root: Path):
        import lightning as L

        from xformer_bench.run import _compile, build_task

        L.seed_everything(config["seed"], workers=True, verbose=False)
        self.trainer, self.root = timing_trainer(config["trainer"], steps), root
        self.datamodule, self.task = build_task(config)
        _compile(self.task.model, config["trainer"].get("compile"))

    def fit(self) -> float:
        """Steps/s of one fit of the timed steps."""
        from xformer_bench.training.throughput import Throughput
        from xformer_bench.training.trainer import build_trainer

        throughput = Throughput(tokens_per_step=0)
        trainer = build_trainer(self.trainer, [], [throughput], self.root)
        trainer.fit(self.task, datamodule=self.datamodule)
        return throughput.steps_per_sec


@contextmanager
def _quiet_lightning() -> Iterator[None]:
    """Lightning's per-fit banners (devices, "max_steps reached") and warnings silenced."""
    logger = logging.getLogger("lightning.pytorch")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def _one_device(trainer: dict[str, Any]) -> bool:
    return trainer.get("devices", 1) in (1, "1") and trainer.get("num_nodes", 1) == 1


def time_rows(records: list[dict[str, Any]], repeats: int = 5, steps: int = 20,
              log: Callable[[str], None] = print) -> dict[str, Any]:
    """The calibrated timing of every row of ``records`` (one study): the ``timing.json``
    payload.  A row trained on several devices is left out (one line): its step is not one
    device's."""
    from xformer_bench.training.timing_conditions import MachineShare

    rows = rows_of(records)
    for key in [k for k, row in rows.items()
                if not _one_device(row["record"]["config"]["trainer"])]:
        log(f"not timed: {rows.pop(key)['label']} trains on several devices")
    machine = MachineShare().start()
    rates: dict[str, list[float]] = {key: [] for key in rows}
    with tempfile.TemporaryDirectory() as folder, _quiet_lightning():
        built = {key: TimedRow(row["record"]["config"], steps, Path(folder))
                 for key, row in rows.items()}
        for row in built.values():  # the warm-up round: not counted
            row.fit()
        for round_ in range(repeats):
            for key, row in built.items():
                rates[key].append(row.fit())
            log(f"round {round_ + 1}/{repeats}: " + ", ".join(
                f"{rows[k]['label']} {rates[k][-1]:.2f}" for k in rows))
    return {"experiment": records[0]["experiment"] if records else None,
            "measured_at": now(), "repeats": repeats, "steps": steps, "warmup_rounds": 1,
            "conditions": machine.conditions(),
            "rows": {key: {"label": row["label"], "run_ids": row["run_ids"],
                           **summarize_rates(rates[key])} for key, row in rows.items()}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m xformer_bench.bench.row_timing",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    parser.add_argument("--experiment", required=True, help="the study whose rows are timed")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (default 5)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round (20)")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"default: <results-dir>/<experiment>/{TIMING_FILE}")
    args = parser.parse_args(argv)
    records = collect(args.results_dir, exclude=(args.results_dir / "tables",)).of(
        args.experiment)
    if not records:
        print(f"error: no records of {args.experiment} under {args.results_dir}",
              file=sys.stderr)
        return 1
    payload = time_rows(records, args.repeats, args.steps)
    if not payload["conditions"]["alone"]:
        print(f"warning: the timing pass shared the machine ({payload['conditions']}): its "
              "Step/s is marked perturbed; time again with the machine to itself",
              file=sys.stderr)
    print(write_json_atomic(args.out or args.results_dir / args.experiment / TIMING_FILE,
                            payload))
    return 0


if __name__ == "__main__":
    sys.exit(main())
