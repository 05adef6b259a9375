"""The sweep's ``~left`` estimate: the mean time of the jobs that trained, times the jobs left,
shared among ``--workers`` (each worker sees every job but runs about 1/N of them)."""

from __future__ import annotations

import pytest

from xformer_bench.parallel_sweep import ENVIRONMENT
from xformer_bench.sweep_report import SweepReport


def estimate_after_one_job(capsys) -> str:
    report = SweepReport(total=5, varying=frozenset({"seed"}))
    report.job_starts(["seed=0"])
    report.job_ends("finished")
    report.jobs[-1].seconds = 600.0  # ten minutes a job
    report.job_starts(["seed=1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    return last.split("elapsed, ~")[1].split(" left")[0]


@pytest.mark.parametrize("workers, left", [(None, "40m00s"), ("2", "20m00s"), ("4", "10m00s")])
def test_the_jobs_left_are_shared_among_the_workers(monkeypatch, capsys, workers, left):
    if workers is None:
        monkeypatch.delenv(ENVIRONMENT, raising=False)
    else:
        monkeypatch.setenv(ENVIRONMENT, workers)
    assert estimate_after_one_job(capsys) == left  # 4 jobs left (this one too) x 10 min / N
