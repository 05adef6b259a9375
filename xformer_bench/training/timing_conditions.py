"""Whether a run had the machine to itself: the record's ``timing_conditions``.

A speed measured while other work shared the machine carries that work's load.  Observed from
the run's start to its end, all cheap (two reads of ``/proc/stat``, a glob of claims):

* ``load_start`` / ``load_end``: the 1-minute load average (``os.getloadavg``), and
  ``cpu_count``;
* ``other_runs``: other xbench runs alive on this host at the start or the end -- the live
  claims (:mod:`~xformer_bench.run_claim`) under the same results folder, this process's own
  left out;
* ``parallel_jobs``: how many jobs the sweep's Hydra launcher runs at once on this machine
  (joblib's ``n_jobs``, or ``--workers N``; 1 for the basic launcher and for SLURM, whose jobs get their own
  allocation);
* ``others_cpu_share``: the share of the machine's CPU time that other processes used during
  the run (busy time in ``/proc/stat`` less this process's and its children's); None where
  ``/proc/stat`` is absent.

``alone`` is True when no other run was alive, the launcher ran one job at a time and other
processes used at most :data:`OTHERS_BUSY_SHARE` of the CPU time.  Nothing here is part of
the run identity: it says how the speed was measured, not what was computed.
"""

from __future__ import annotations

import os
import resource
import socket
import time
from pathlib import Path
from typing import Any

from xformer_bench.run_claim import holder_of

OTHERS_BUSY_SHARE = 0.25
"""Above this share of the machine's CPU time used by other processes, a run was not alone."""


def _busy_cpu_seconds() -> float | None:
    """CPU seconds the whole machine has spent busy since boot (``/proc/stat``), else None."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[1:9])
    except (OSError, ValueError, IndexError):
        return None
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU seconds of this process (all threads) and of its children that ended."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def other_runs(results_dir: Path | None) -> int:
    """Live claims of other processes of this host under ``results_dir``: runs training now."""
    if results_dir is None or not Path(results_dir).is_dir():
        return 0
    me = f"{socket.gethostname()}:{os.getpid()}"
    count = 0
    for claim in Path(results_dir).rglob(".*.claim"):
        holder = holder_of(claim.with_name(claim.name[1:].removesuffix(".claim") + ".json"))
        if holder is not None and holder != me and holder.startswith(socket.gethostname() + ":"):
            count += 1
    return count


def parallel_jobs() -> int:
    """Jobs the running Hydra sweep's launcher runs at once on this machine (1 outside one), or
    the workers of ``xbench -m ... --workers N`` (:mod:`xformer_bench.parallel_sweep`)."""
    workers = os.environ.get("XBENCH_WORKERS", "")
    if workers.isdigit() and int(workers) > 1:
        return int(workers)
    try:
        from hydra.core.hydra_config import HydraConfig
    except ImportError:
        return 1
    if not HydraConfig.initialized():
        return 1
    n_jobs = (HydraConfig.get().get("launcher") or {}).get("n_jobs")  # joblib's; -1: every core
    if not isinstance(n_jobs, int):
        return 1
    return max(1, n_jobs if n_jobs > 0 else (os.cpu_count() or 1) + 1 + n_jobs)


class MachineShare:
    """Observes the machine from :meth:`start` to :meth:`conditions` (a run, a timing pass)."""

    def __init__(self, results_dir: Path | None = None):
        self.results_dir = results_dir
        self._start: tuple[float, float | None, float, float | None, int] | None = None

    def start(self) -> MachineShare:
        self._start = (time.perf_counter(), _busy_cpu_seconds(), _own_cpu_seconds(), _load(),
                       other_runs(self.results_dir))
        return self

    def conditions(self) -> dict[str, Any]:
        """The ``timing_conditions`` since :meth:`start`."""
        assert self._start is not None, "start() first"
        wall0, busy0, own0, load0, others0 = self._start
        wall, busy, own = time.perf_counter() - wall0, _busy_cpu_seconds(), _own_cpu_seconds()
        cpus = os.cpu_count() or 1
        share = None
        if busy is not None and busy0 is not None and wall > 0:
            share = max(0.0, (busy - busy0) - (own - own0)) / (wall * cpus)
        runs, jobs = max(others0, other_runs(self.results_dir)), parallel_jobs()
        return {"cpu_count": cpus, "load_start": load0, "load_end": _load(),
                "other_runs": runs, "parallel_jobs": jobs, "others_cpu_share": share,
                "alone": runs == 0 and jobs <= 1
                and (share is None or share <= OTHERS_BUSY_SHARE)}
