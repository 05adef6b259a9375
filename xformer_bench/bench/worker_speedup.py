"""Whether ``--workers N`` pays on this machine, row by row: each row of a study timed alone on
every core, then as N processes at once, each pinned to its share of the cores with as many
threads -- the arrangement :mod:`xformer_bench.parallel_sweep` gives its workers.

    python -m xformer_bench.bench.worker_speedup --results-dir results --experiment systems_lm \
        --rows Reformer Compressive --workers 2

Each row is rebuilt from one of its records and timed as the timing pass times it
(:class:`~xformer_bench.bench.row_timing.TimedRow`: the run's training path, validation off; one
warm-up fit, then ``--rounds`` fits of ``--steps`` steps), in a fresh process per measurement.
The speed-up is the N processes' summed steps/s over the lone process's: above 1, N runs at
once finish a study sooner.  Run it with the machine to itself: what else runs is in the
numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xformer_bench.bench.row_timing import rows_of
from xformer_bench.parallel_sweep import core_shares
from xformer_bench.results.collect import collect

MODULE = "xformer_bench.bench.worker_speedup"
PROBE = "--probe"
"""The flag of one measuring process: ``--probe CONFIG.json``, its steps/s per round on the
last line of its output."""


def probe_command(config_path: Path, steps: int, rounds: int) -> list[str]:
    return [sys.executable, "-m", MODULE, PROBE, str(config_path), "--steps", str(steps),
            "--rounds", str(rounds)]


def measure(config: dict[str, Any], workers: int, steps: int, rounds: int,
            cores: Sequence[int] | None = None) -> dict[str, Any]:
    """Median steps/s of the row alone on ``cores`` and of each of ``workers`` processes at once
    on their shares; ``speedup``: the workers' sum over the lone rate."""
    cores = sorted(cores or os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_text(json.dumps(config))
        [alone] = _run_at_once(probe_command(path, steps, rounds), [cores])
        each = _run_at_once(probe_command(path, steps, rounds), core_shares(cores, workers))
    return {"alone": alone, "workers": each, "speedup": sum(each) / alone}


def _run_at_once(command: list[str], shares: list[list[int]]) -> list[float]:
    processes = [subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "OMP_NUM_THREADS": str(len(share)),
             "MKL_NUM_THREADS": str(len(share))},
        preexec_fn=lambda share=share: os.sched_setaffinity(0, share)) for share in shares]
    rates = []
    for process, (out, err) in [(p, p.communicate()) for p in processes]:  # all end first
        if process.returncode != 0:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"a probe ({' '.join(command[2:4])}) failed: {last}")
        rates.append(statistics.median(json.loads(out.strip().splitlines()[-1])))
    return rates


def _probe(config_path: Path, steps: int, rounds: int) -> list[float]:
    import torch

    from xformer_bench.bench.row_timing import TimedRow, _quiet_lightning

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))
    config = json.loads(config_path.read_text())
    with tempfile.TemporaryDirectory() as folder, _quiet_lightning():
        row = TimedRow(config, steps, Path(folder))
        row.fit()  # warm-up
        return [row.fit() for _ in range(rounds)]


def table(results: dict[str, dict[str, Any]], workers: int) -> str:
    lines = [f"| row | alone, all cores (steps/s) | {workers} at once, each (steps/s) | "
             "speed-up |", "|---|---:|---:|---:|"]
    for label, result in results.items():
        each = ", ".join(f"{r:.2f}" for r in result["workers"])
        lines.append(f"| {label} | {result['alone']:.2f} | {each} | "
                     f"{result['speedup']:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description=__doc__.splitlines()[0])
    parser.add_argument(PROBE, type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--results-dir", type=Path, default=Path("results"))
    parser.add_argument("--experiment", help="the study whose rows are timed")
    parser.add_argument("--rows", nargs="*", default=[],
                        help="rows whose label contains one of these (default: every row)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round (20)")
    parser.add_argument("--rounds", type=int, default=2, help="timed rounds (2)")
    parser.add_argument("--data-path", help="data.path for the rebuilt rows, where the "
                        "records' own is not found from here")
    args = parser.parse_args(argv)
    if args.probe is not None:
        print(json.dumps(_probe(args.probe, args.steps, args.rounds)))
        return 0
    records = collect(args.results_dir, exclude=(args.results_dir / "tables",)).of(
        args.experiment) if args.experiment else []
    rows = {row["label"]: row["record"]["config"] for row in rows_of(records).values()
            if not args.rows or any(part in row["label"] for part in args.rows)}
    if not rows:
        print(f"error: no rows of {args.experiment} under {args.results_dir} match "
              f"{args.rows or 'any label'}", file=sys.stderr)
        return 1
    results = {}
    for label, config in rows.items():
        if args.data_path:
            config = {**config, "data": {**config["data"], "path": args.data_path}}
        results[label] = measure(config, args.workers, args.steps, args.rounds)
        print(table({label: results[label]}, args.workers).splitlines()[-1], flush=True)
    print(table(results, args.workers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
