"""Speed measured under control: each record says whether its run had the
machine to itself, a calibrated pass times every row of a study alone (``timing.json``), and
the table's Step/s comes from that pass when it exists, is marked when measured on a shared
machine and flagged when its spread exceeds 30 %."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import TINY_RUN, choice_groups, compose_config, run_tiny
from xformer_bench.bench.row_timing import main as time_rows_main
from xformer_bench.metric_spec import BITS_PER
from xformer_bench.results import record as records
from xformer_bench.results.aggregate import build_table
from xformer_bench.results.columns import PERTURBED, WIDE_SPREAD
from xformer_bench.results.markdown import render
from xformer_bench.results.report import make_tables
from xformer_bench.results.speed import CALIBRATED
from xformer_bench.results.variants import group_variants
from xformer_bench.run_claim import claim_path
from xformer_bench.training import timing_conditions
from xformer_bench.training.timing_conditions import MachineShare

STUDY = "speed_fixture"


@pytest.fixture
def quiet_machine(monkeypatch):
    """Other processes' CPU time unmeasured: ``alone`` depends on the claims and launcher only
    (the test machine's own load is not the test's subject)."""
    monkeypatch.setattr(timing_conditions, "_busy_cpu_seconds", lambda: None)


@pytest.fixture
def other_run(tmp_path):
    """A live process of this host holding a claim under ``tmp_path/results``: another run."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    claim = claim_path(tmp_path / "results" / "other_study" / "some-run_s0_0123456789.json")
    claim.parent.mkdir(parents=True)
    claim.write_text(f"{socket.gethostname()} {process.pid}\n")
    yield claim
    process.kill()
    process.wait()


def test_alone_without_other_runs_and_not_alone_beside_a_live_claim(tmp_path, quiet_machine):
    (tmp_path / "results").mkdir()
    alone = MachineShare(tmp_path / "results").start().conditions()
    assert alone["alone"] is True and alone["other_runs"] == 0
    assert set(alone) >= {"load_start", "load_end", "cpu_count", "parallel_jobs"}
    stale = claim_path(tmp_path / "results" / "x" / "dead_s0_0.json")
    stale.parent.mkdir()
    stale.write_text(f"{socket.gethostname()} 999999999\n")  # a process that is gone
    assert MachineShare(tmp_path / "results").start().conditions()["alone"] is True


def test_other_processes_busy_cpu_makes_a_run_not_alone(monkeypatch, tmp_path):
    busy = iter([0.0, 1000.0])  # the machine busy for 1000 CPU s during the observation
    monkeypatch.setattr(timing_conditions, "_busy_cpu_seconds", lambda: next(busy))
    conditions = MachineShare(tmp_path).start().conditions()
    assert conditions["others_cpu_share"] > timing_conditions.OTHERS_BUSY_SHARE
    assert conditions["alone"] is False


def test_a_run_beside_another_records_it_without_changing_its_identity(tmp_path, other_run):
    record = run_tiny(tmp_path, "trainer.max_steps=4", "trainer.val_checks=1")
    conditions = record["timing_conditions"]
    assert conditions["other_runs"] == 1 and conditions["alone"] is False
    assert records.run_identity(record["config"], record["choices"]) == record["run_id"]
    saved = json.loads(Path(record["record_path"]).read_text())
    assert saved["timing_conditions"]["alone"] is False


def _record(results: Path, activation: str, seed: int, steps_per_sec: float,
            alone: bool | None) -> dict:
    """A finished fixture run of ``STUDY`` at tiny dims (its speed and conditions as given)."""
    overrides = (*TINY_RUN, f"paths.results_dir={results}", f"activation={activation}",
                 f"seed={seed}", f"experiment_name={STUDY}")
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    record = records.new_record(config, choices, list(overrides), results / "run")
    record.update(status="finished", steps_per_sec=steps_per_sec, params=1000,
                  steps=config["trainer"]["max_steps"], final={"val/bpb": 2.0},
                  test={"test/bpb": 2.1 + 0.01 * seed + 0.001 * (activation == "gelu")},
                  **records.task_fields("lm", [BITS_PER["bytes"]], "bytes"))
    if alone is not None:
        record["timing_conditions"] = {"alone": alone}
    return record


def _speed_cells(study: list[dict]) -> tuple[dict, object]:
    """The Step/s cell of each row, by label, and the table."""
    table = build_table(STUDY, group_variants(study))
    column = [c.key for c in table.columns].index("steps_per_sec")
    return {row.label: row.cells[column] for row in table.rows}, table


def test_a_shared_run_marks_the_speed_and_a_wide_spread_is_flagged(tmp_path):
    study = [_record(tmp_path, "relu", s, 10.0 + 0.1 * s, alone=True) for s in range(3)]
    study += [_record(tmp_path, "gelu", s, 10.0 + 0.1 * s, alone=s != 1) for s in range(3)]
    study += [_record(tmp_path, "swish", s, 5.0 + 4 * s, alone=True) for s in range(3)]
    cells, table = _speed_cells(study)
    assert cells["ReLU"].footnote == ""
    assert cells["GeLU"].footnote == PERTURBED
    assert cells["Swish"].footnote == WIDE_SPREAD  # ± 4 on 9: 44 %
    text = render(table)
    assert "10.10 ± 0.10\\*" in text and "9.00 ± 4.00§" in text
    assert "perturbed: measured while other work shared the machine" in text
    assert "above 30% of the value: not a result" in text


def test_records_without_timing_conditions_are_not_marked(tmp_path):
    cells, table = _speed_cells([_record(tmp_path, "relu", s, 10.0, None) for s in range(2)])
    (cell,) = cells.values()
    assert cell.footnote == "" and table.notes == ()


def test_the_calibrated_pass_writes_timing_json_and_the_table_takes_speed_from_it(
        tmp_path, quiet_machine):
    results = tmp_path / "results"
    for activation in ("relu", "gelu"):
        for seed in (0, 1):  # runs that shared the machine: their speeds are no result
            record = _record(results, activation, seed, 1.0 + 7 * seed, alone=False)
            records.write_json_atomic(records.results_path(record["config"], record["run_id"]),
                                      record)
    assert time_rows_main(["--results-dir", str(results), "--experiment", STUDY,
                           "--repeats", "2", "--steps", "2"]) == 0
    timing = json.loads((results / STUDY / "timing.json").read_text())
    assert timing["repeats"] == 2 and timing["conditions"]["alone"] is True
    assert {row["label"] for row in timing["rows"].values()} == {"ReLU", "GeLU"}
    for row in timing["rows"].values():
        assert len(row["rates"]) == 2 and len(row["run_ids"]) == 2
        assert row["steps_per_sec"] > 0 and row["spread"] == pytest.approx(
            row["iqr"] / row["steps_per_sec"])

    logged: list[str] = []
    make_tables(results, tmp_path / "tables", plots=False, log=logged.append)
    assert logged == []  # timing.json is not read as a (broken) run record
    text = (tmp_path / "tables" / f"{STUDY}.md").read_text()
    relu = next(r for r in timing["rows"].values() if r["label"] == "ReLU")
    assert f"{relu['steps_per_sec']:.2f} ± {relu['iqr']:.2f}" in text
    assert "median ± IQR over 2 repeats of 2 training steps per row" in text
    assert "perturbed" not in text  # the calibrated speed replaces the shared runs'


def test_a_calibration_measured_on_a_shared_machine_is_marked_too(tmp_path):
    study = [_record(tmp_path, "relu", 0, 3.0, alone=False)]
    timed = {"steps_per_sec": 10.0, "iqr": 0.5, "rates": [9.8, 10.0, 10.3], "repeats": 3,
             "steps": 20, "conditions": {"alone": False}}
    cells, table = _speed_cells([{**study[0], CALIBRATED: timed}])
    (cell,) = cells.values()
    assert (cell.mean, cell.std, cell.footnote) == (10.0, 0.5, PERTURBED)
    assert "median ± IQR over 3 repeats of 20 training steps" in " ".join(table.notes)
