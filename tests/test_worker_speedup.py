"""``python -m xformer_bench.bench.worker_speedup``: a row alone on every core against N
processes at once, each pinned to its share with as many threads (as ``--workers`` runs them)."""

from __future__ import annotations

import os
import sys

import pytest
from conftest import TINY_RUN

from xformer_bench.bench.worker_speedup import _run_at_once, main, measure, table
from xformer_bench.parallel_sweep import core_shares

CORES = sorted(os.sched_getaffinity(0))
REPORT = ("import json, os; print(json.dumps([100 * len(os.sched_getaffinity(0)) "
          "+ int(os.environ['OMP_NUM_THREADS'])]))")


@pytest.mark.skipif(len(CORES) < 2, reason="needs two cores to share")
def test_each_process_runs_on_its_share_of_the_cores_with_as_many_threads():
    command = [sys.executable, "-c", REPORT]
    assert _run_at_once(command, [CORES]) == [101 * len(CORES)]
    shares = core_shares(CORES, 2)
    assert _run_at_once(command, shares) == [101 * len(share) for share in shares]


def test_a_failing_probe_is_an_error_with_its_last_line():
    with pytest.raises(RuntimeError, match="boom"):
        _run_at_once([sys.executable, "-c", "raise SystemExit('boom')"], [CORES])


def test_the_speedup_is_the_workers_sum_over_the_lone_rate():
    text = table({"Reformer": {"alone": 0.87, "workers": [0.60, 0.60], "speedup": 1.2 / 0.87}},
                 workers=2)
    assert text.splitlines()[-1] == "| Reformer | 0.87 | 0.60, 0.60 | 1.38x |"


def test_no_matching_row_is_an_error(tmp_path, capsys):
    assert main(["--results-dir", str(tmp_path), "--experiment", "nothing"]) == 1
    assert capsys.readouterr().err.startswith("error: no rows of nothing")


@pytest.mark.slow
def test_a_tiny_row_is_measured_alone_and_in_two_workers(tmp_path):
    from xformer_bench.config import compose_config

    config = compose_config(*TINY_RUN, f"paths.data_dir={tmp_path / 'data'}")
    result = measure(config, workers=2, steps=2, rounds=1)
    assert result["alone"] > 0 and len(result["workers"]) == 2
    assert result["speedup"] == pytest.approx(sum(result["workers"]) / result["alone"])
