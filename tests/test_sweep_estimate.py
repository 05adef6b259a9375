"""The sweep's ``~left`` estimate: the mean time of the jobs that trained whole (not resumed),
times the jobs left, shared among ``--workers`` (each worker sees every job but runs about 1/N
of them)."""

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


def test_a_resumed_job_is_counted_but_left_out_of_the_estimate(monkeypatch, capsys):
    """A job resumed near its end took minutes of a run of hours: the estimate from it alone
    said "~19m left" where three hours were."""
    monkeypatch.delenv(ENVIRONMENT, raising=False)
    report = SweepReport(total=4, varying=frozenset({"seed"}))
    for seed, kind, seconds in ((0, "resumed", 60.0), (1, "finished", 600.0)):
        report.job_starts([f"seed={seed}"])
        report.job_ends(kind)
        report.jobs[-1].seconds = seconds
    report.job_starts(["seed=2"])
    assert capsys.readouterr().out.strip().splitlines()[-1].split("~")[1].startswith(
        "20m00s left")  # 2 jobs left x the whole job's 10 min, not the mean with the resumed
    report.job_ends("finished")
    assert "2 finished, 1 resumed" in report.summary()[0] and report.exit_status() == 0


@pytest.mark.parametrize("resumed_from, kind", [(None, "finished"), ("step-00000900.ckpt",
                                                                     "resumed")])
def test_a_job_says_whether_it_resumed(monkeypatch, resumed_from, kind):
    import xformer_bench.job as job
    import xformer_bench.run as run

    monkeypatch.setattr(run, "execute", lambda *args: {"resumed_from": resumed_from})
    monkeypatch.setattr(job, "_report", lambda record: None)
    monkeypatch.setattr(job, "_objective", lambda record: None)
    assert job._claimed_job({}, {}, [], None, multirun=True)[0] == kind
