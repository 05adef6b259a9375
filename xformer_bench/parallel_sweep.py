"""``xbench -m ... --workers N``: one sweep's jobs shared by N processes on this machine.

Small models leave a CPU's cores idle (a d128 model's matrix products are too small to keep two
threads busy), so N runs at once, each on its own share of the cores, finish a study sooner than
one run at a time on all of them.  Each worker is the same ``xbench -m`` command, pinned to its
cores (``sched_setaffinity``) with as many threads (``OMP_NUM_THREADS``); the workers divide the
jobs through the runs' claims (each in its own sweep folder) (:mod:`xformer_bench.run_claim`): a job another worker holds is
left to it, a finished one skipped, so nothing trains twice and a stopped study resumes by
running the command again.  Their lines come through prefixed ``[wK]``; the exit status is the
worst of theirs.

The runs' own steps/s are measured while the other workers share the machine: their records
say so (``timing_conditions.parallel_jobs``), and the table's Step/s comes from the calibrated
timing pass (``make time-rows``, run alone), never from these runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

from xformer_bench.errors import ConfigError

FLAG = "--workers"
SWEEP_DIR = "multirun/${now:%Y-%m-%d}/${now:%H-%M-%S}"
"""Hydra's default sweep folder: the workers' folders go under it unless one is given."""
ENVIRONMENT = "XBENCH_WORKERS"
"""Set in each worker to N: :func:`xformer_bench.training.timing_conditions.parallel_jobs`."""


def split_workers(argv: Sequence[str]) -> tuple[int | None, list[str]]:
    """(N of ``--workers N`` or ``--workers=N``, else None; ``argv`` without it)."""
    kept, workers, index = [], None, 0
    arguments = list(argv)
    while index < len(arguments):
        arg = arguments[index]
        if arg == FLAG or arg.startswith(FLAG + "="):
            value = arg.split("=", 1)[1] if "=" in arg else (
                arguments[index + 1] if index + 1 < len(arguments) else "")
            index += 1 if "=" in arg else 2
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"{FLAG} takes a number of processes, at least 1 (got "
                                  f"{value!r}): e.g. xbench -m experiment=narang_table1 {FLAG} 2")
            workers = int(value)
            continue
        kept.append(arg)
        index += 1
    return workers, kept


def core_shares(cores: Sequence[int], workers: int) -> list[list[int]]:
    """The cores of each worker: contiguous, as equal as they divide; with more workers than
    cores, the cores are shared round-robin (one each)."""
    cores = sorted(cores)
    if workers >= len(cores):
        return [[cores[i % len(cores)]] for i in range(workers)]
    size, extra = divmod(len(cores), workers)
    shares, start = [], 0
    for i in range(workers):
        end = start + size + (i < extra)
        shares.append(cores[start:end])
        start = end
    return shares


def worker_command(argv: Sequence[str], index: int) -> list[str]:
    """Worker ``index``'s command line: the sweep with ``skip_completed=true`` (a job another
    worker finished is not trained again), its progress bar off (lines interleave) and its
    sweep folder its own (``<hydra.sweep.dir>/w<index>``)."""
    replaced = ("trainer.progress_bar=", "hydra.sweep.dir=", "skip_completed=")
    kept = [a for a in argv if not a.lstrip("+~").startswith(replaced)]
    given = [a.split("=", 1)[1] for a in argv if a.startswith("hydra.sweep.dir=")]
    folder = given[-1] if given else SWEEP_DIR
    return [sys.executable, "-m", "xformer_bench.cli", *kept, "skip_completed=true",
            "trainer.progress_bar=false", f"hydra.sweep.dir={folder}/w{index}"]


def run_workers(argv: Sequence[str], workers: int) -> int:
    """Run the sweep ``argv`` in ``workers`` processes; their worst exit status."""
    shares = core_shares(sorted(os.sched_getaffinity(0)), workers)
    print(f"[xbench] {workers} workers, cores {' | '.join(','.join(map(str, s)) for s in shares)}"
          f": each runs the sweep, taking the jobs no other holds", flush=True)
    processes, relays = [], []
    forward = _Forward(processes)  # from before the first worker starts: no signal is lost
    forwarded = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    for index, cores in enumerate(shares, start=1):
        env = {**os.environ, ENVIRONMENT: str(workers), "OMP_NUM_THREADS": str(len(cores)),
               "MKL_NUM_THREADS": str(len(cores))}
        process = subprocess.Popen(
            worker_command(argv, index), env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, bufsize=1,
            preexec_fn=lambda cores=cores: os.sched_setaffinity(0, cores))
        relay = threading.Thread(target=_relay, args=(process, f"[w{index}] "), daemon=True)
        relay.start()
        processes.append(process)
        relays.append(relay)
    forward.again()  # one that came while the workers were starting reaches them all
    statuses = []
    for process, relay in zip(processes, relays):
        while True:
            try:
                statuses.append(process.wait())
                break
            except KeyboardInterrupt:  # the workers got the signal too: let them record it
                continue
        relay.join()
    for signum, handler in forwarded.items():
        signal.signal(signum, handler)
    status = worst(statuses)
    print("[xbench] workers ended: " + ", ".join(f"w{i} exit {s}" for i, s in
                                                  enumerate(statuses, start=1)),
          file=sys.stderr if status else sys.stdout, flush=True)
    return status


FORWARDED = (signal.SIGTERM, signal.SIGUSR1)
"""Signals a scheduler sends the sweep's own process (``timeout``, ``scancel``, SLURM's
pre-emption warning): passed on to every worker, which records its run as interrupted and keeps
a resume point (:mod:`xformer_bench.training.preemption`); a terminal's SIGINT reaches them all
already."""


class _Forward:
    """The signal handler that passes a signal on to every running worker; it remembers the
    last one, for the workers started after it came."""

    def __init__(self, processes: Sequence[subprocess.Popen]):
        self.processes, self.received = processes, None

    def __call__(self, signum, _frame) -> None:
        self.received = signum
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signum)

    def again(self) -> None:
        if self.received is not None:
            self(self.received, None)


def worst(statuses: Sequence[int]) -> int:
    """2 when any worker was refused or interrupted (or killed by a signal), else 1 when any
    failed, else 0: a single sweep's statuses (:mod:`xformer_bench.sweep_report`)."""
    if any(s == 2 or s < 0 for s in statuses):
        return 2
    return 1 if any(statuses) else 0


def _relay(process: subprocess.Popen, prefix: str) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        sys.stdout.write(prefix + line)
        sys.stdout.flush()
