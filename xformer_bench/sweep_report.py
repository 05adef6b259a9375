"""What a sweep tells its user: ``k/N`` before each job, with the time spent and an estimate of
what is left, and at the end one line per job that did not finish, the counts, and the exit
status -- non-zero when any job was refused, failed or was interrupted (a sweep that hid its
failures behind exit 0 let a study look complete) -- and the notes its jobs left for the end
(:attr:`SweepReport.notes`: one ``wandb sync`` for the whole sweep).

One report per ``xbench -m`` invocation (:func:`begin`), filled by each job as it ends
(:func:`outcome`); Hydra's basic launcher runs the jobs in this process, one after another.  A
launcher that runs them elsewhere (submitit) reports there: the summary then counts what this
process saw.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field

KINDS = ("finished", "resumed", "skipped", "worker", "elsewhere", "refused", "failed",
         "interrupted")
"""A job's outcome: trained and recorded; trained from an earlier attempt's resume point and
recorded (its time is a part of a run's: the estimate leaves it out); skipped as already
finished (``skip_completed``); left to another worker of the same ``--workers`` sweep; left to
another process that holds its claim; refused before training (one ``error:`` line); failed
while training (its record says how); stopped by a signal."""
SHOWN_AS = {"worker": "with the other workers"}
"""How a kind reads in the summary's counts, where its name alone would not."""
FAILING = ("refused", "failed", "interrupted")
EXIT_STATUS = {"refused": 2, "failed": 1, "interrupted": 2}
"""The sweep's exit status for its first failing kind, as a single run's: 2 for xbench's own
errors (a refusal, an interruption), 1 for anything else."""


@dataclass
class Job:
    number: int
    what: str
    kind: str | None = None
    line: str = ""
    seconds: float = 0.0


@dataclass
class SweepReport:
    total: int
    varying: frozenset[str] = frozenset()  # the keys whose values differ between jobs
    jobs: list[Job] = field(default_factory=list)
    started: float = field(default_factory=time.perf_counter)
    notes: dict[str, str] = field(default_factory=dict)
    """A line per topic, printed once after the summary: what concerns every job, said once
    (the one ``wandb sync`` of the sweep's offline runs)."""

    def job_starts(self, overrides: list[str]) -> None:
        """``[xbench] job k/N (elapsed, ~left): key=value ...`` -- the keys the sweep varies;
        the estimate from the jobs that trained whole (a skipped job takes no time, a resumed
        one only its rest), the jobs left
        shared among the sweep's workers (``--workers N``: each runs about 1/N of them)."""
        from xformer_bench.training.timing_conditions import parallel_jobs

        shown = [o for o in overrides if o.split("=", 1)[0].lstrip("+~") in self.varying]
        what = " ".join(shown or overrides) or "(defaults)"
        self.jobs.append(Job(len(self.jobs) + 1, what))
        elapsed = time.perf_counter() - self.started
        trained = [j.seconds for j in self.jobs if j.kind in ("finished", "failed")]
        left = len(self.jobs) - 1
        share = (self.total - left) / parallel_jobs()
        estimate = (f", ~{clock(sum(trained) / len(trained) * share)} left" if trained else "")
        print(f"[xbench] job {len(self.jobs)}/{self.total} ({clock(elapsed)} elapsed"
              f"{estimate}): {what}", flush=True)
        self._job_started = time.perf_counter()

    def job_ends(self, kind: str, line: str = "") -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown outcome {kind!r}; one of {KINDS}")
        if not self.jobs or self.jobs[-1].kind is not None:
            self.jobs.append(Job(len(self.jobs) + 1, ""))  # a job not announced (its own sweep)
        job = self.jobs[-1]
        job.kind, job.line = kind, line
        job.seconds = time.perf_counter() - getattr(self, "_job_started", self.started)

    def summary(self) -> list[str]:
        """The counts, then one line per job that did not finish (skips by kind, counted)."""
        counts = {k: sum(j.kind == k for j in self.jobs) for k in KINDS}
        unreached = self.total - len(self.jobs)
        shown = ", ".join(f"{n} {SHOWN_AS.get(k, k)}" for k, n in counts.items() if n)
        lines = [f"[xbench] sweep: {len(self.jobs)} of {self.total} jobs in "
                 f"{clock(time.perf_counter() - self.started)}: {shown or 'none run'}"
                 + (f", {unreached} not reached" if unreached > 0 else "")]
        lines += [f"[xbench]   job {j.number} {j.kind}: {j.what}" + (f" -- {j.line}" if j.line else "")
                  for j in self.jobs if j.kind in (*FAILING, "elsewhere")]
        return lines

    def exit_status(self) -> int:
        """0 when every job finished (resumed or not) or was skipped as finished, else the first failing kind's
        status (:data:`EXIT_STATUS`)."""
        for job in self.jobs:
            if job.kind in FAILING:
                return EXIT_STATUS[job.kind]
        return 0


def clock(seconds: float) -> str:
    """75.4 -> '1m15s', 3725 -> '1h02m'."""
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{secs:02d}s"


_CURRENT: SweepReport | None = None


def begin(jobs: list[list[str]]) -> SweepReport:
    """The report of a sweep of ``jobs`` (each its overrides), for this process's jobs to fill."""
    global _CURRENT
    values: dict[str, list[str]] = {}
    for overrides in jobs:
        for override in overrides:
            key, _, value = override.partition("=")
            values.setdefault(key.lstrip("+~"), []).append(value)
    varying = frozenset(k for k, v in values.items() if len(set(v)) > 1 or len(v) < len(jobs))
    _CURRENT = SweepReport(len(jobs), varying)
    return _CURRENT


def current() -> SweepReport | None:
    """The report of the sweep running in this process; None for a single run."""
    return _CURRENT


def end() -> int:
    """Print the summary (stderr when anything failed) and return the sweep's exit status."""
    global _CURRENT
    report, _CURRENT = _CURRENT, None
    if report is None:
        return 0
    status = report.exit_status()
    print("\n".join(report.summary()), file=sys.stderr if status else sys.stdout, flush=True)
    for line in report.notes.values():
        print(line, flush=True)
    return status
