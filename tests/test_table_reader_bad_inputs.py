"""The table reader on bad inputs: each planted in a copy of shipped records, each
answered by one named ``skipped``/``warning`` line or one ``error:`` line, never a traceback.

A finished run without a finite primary metric is no seed; runs of another dataset at another
scale are not set beside the study's, nor runs that differ in a setting averaged as seeds;
an unwritable ``--out``, a missing reference table, a malformed history and a malformed or
truncated ``timing.json`` are one line each; ``make table`` fails when its tables fail.
"""

from __future__ import annotations

import csv
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xformer_bench.results import report
from xformer_bench.results.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "results" / "reference" / "narang_activations_300_steps_tinyshakespeare" / "records"
STUDY = "narang_activations"


def study_copy(tmp_path: Path, *activations: str) -> Path:
    """A results folder holding the shipped runs of ``activations`` (3 seeds each)."""
    folder = tmp_path / "results" / STUDY
    folder.mkdir(parents=True)
    for activation in activations:
        for path in (SHIPPED / STUDY).glob(f"*-{activation}-*.json"):
            shutil.copy(path, folder)
    return tmp_path / "results"


def plant(results: Path, source: str, name: str, change) -> Path:
    """A copy of the first shipped run of ``source`` as ``name``, changed by ``change``."""
    record = json.loads(sorted((results / STUDY).glob(f"*-{source}-*_s0_*.json"))[0].read_text())
    change(record)
    record["run_id"] = name
    path = results / STUDY / f"{name}.json"
    path.write_text(json.dumps(record))
    return path


def tables(results: Path, out: Path, capsys, *extra: str) -> tuple[int, list[str]]:
    """Exit status and stderr lines of ``python -m xformer_bench.results`` (in-process)."""
    status = main(["--results-dir", str(results), "--out", str(out), "--no-plots", *extra])
    return status, capsys.readouterr().err.splitlines()


def rows(out: Path, name: str = STUDY) -> dict[str, dict[str, str]]:
    """The table's CSV rows by label (less the ``#`` lines: the paper beside it)."""
    with open(out / f"{name}.csv", newline="", encoding="utf-8") as f:
        return {row["variant"]: row for row in csv.DictReader(f)
                if not row["variant"].startswith("#")}


def test_shipped_copies_make_a_table_without_a_line(tmp_path, capsys):
    """The baseline of every case below: three seeds per row, nothing skipped or warned."""
    status, err = tables(study_copy(tmp_path, "relu", "gelu"), tmp_path / "out", capsys)
    assert status == 0 and err == []
    assert {v: r["seeds_finished"] for v, r in rows(tmp_path / "out").items()} == \
        {"ReLU": "3", "GeLU": "3"}


@pytest.mark.parametrize("split, value, reason", [
    ("test", math.nan, "finished but its test bpb is nan"),
    ("final", None, "finished but its final validation bpb is missing"),
])
def test_a_finished_run_without_a_finite_primary_metric_is_no_seed(tmp_path, capsys, split,
                                                                    value, reason):
    results = study_copy(tmp_path, "relu", "gelu")
    before = rows(_made(results, tmp_path / "before", capsys))["GeLU"]

    def unmeasured(record):
        record["seed"] = 3
        record[split][f"{'test' if split == 'test' else 'val'}/bpb"] = value

    planted = plant(results, "gelu", "gelu_s3_nan", unmeasured)
    status, err = tables(results, tmp_path / "out", capsys)
    assert status == 0 and err == [f"skipped {planted}: {reason}"]
    after = rows(tmp_path / "out")["GeLU"]
    assert (after["seeds_finished"], after["seeds_total"]) == ("3", "3")  # not 4
    assert after["text_bpb"] == before["text_bpb"]  # its other columns not averaged in
    assert after["final_loss"] == before["final_loss"]


def _made(results: Path, out: Path, capsys) -> Path:
    assert tables(results, out, capsys)[0] == 0
    return out


def test_a_smoke_run_on_another_dataset_gets_its_own_table_not_a_column(tmp_path, capsys):
    results = study_copy(tmp_path, "relu", "gelu")

    def smoke(record):  # a 3-step synthetic run of the same row
        record["choices"]["data"] = "synthetic"
        record["config"]["data"] = {"name": "synthetic", "label": "Synthetic", "seq_len": 128}
        record["config"]["trainer"]["max_steps"] = record["steps"] = 3

    plant(results, "relu", "relu_synthetic_smoke", smoke)
    status, err = tables(results, tmp_path / "out", capsys)
    assert status == 0
    assert err == [f"warning: {STUDY}: 1 run on synthetic differs from the runs on text in "
                   f"trainer.max_steps 3 (not 300): not set beside them; their own table, "
                   f"{STUDY}__synthetic"]
    main_table = rows(tmp_path / "out")["ReLU"]
    assert "synthetic_bpb" not in main_table and main_table["seeds_total"] == "3"
    apart = rows(tmp_path / "out", f"{STUDY}__synthetic")
    assert [(r["seeds_total"], r["synthetic_bpb"] != "") for r in apart.values()] == [("1", True)]


@pytest.mark.parametrize("key, change, label", [
    ("trainer.max_steps", lambda c: c["trainer"].update(max_steps=30), "trainer.max_steps=30"),
    ("data.path", lambda c: c["data"].update(path="/elsewhere/other.txt"),
     "data.path=/elsewhere/other.txt"),
    ("model.d_model", lambda c: c["model"].update(d_model=64), "model.d_model=64"),
])
def test_runs_of_one_row_that_differ_in_a_setting_are_never_averaged_as_seeds(
        tmp_path, capsys, key, change, label):
    results = study_copy(tmp_path, "relu", "gelu")

    def other(record):  # set in the configuration only, as an edited study file would
        record["seed"] = 3
        change(record["config"])
        record["steps"] = record["config"]["trainer"]["max_steps"]

    plant(results, "relu", "relu_other_setting", other)
    status, err = tables(results, tmp_path / "out", capsys)
    assert status == 0 and not [line for line in err if "averaged as seeds" in line]
    seeds = {v: r["seeds_total"] for v, r in rows(tmp_path / "out").items()}
    assert sorted(seeds.values()) == ["1", "3", "3"]  # never 4 seeds
    assert [v for v, n in seeds.items() if n == "1"] == [f"ReLU, {label}"]  # named by it


def test_a_json_that_is_no_run_record_is_one_summary_line(tmp_path, capsys):
    """results/bench (benchmark outputs) is not read at all: not a line; JSON elsewhere that
    claims no run (no schema, no run_id) is one summary line."""
    results = study_copy(tmp_path, "relu", "gelu")
    for folder in ("bench", "notes"):
        (results / folder).mkdir()
        for name in ("train.json", "flex_cuda.json"):
            shutil.copy(ROOT / "results" / "bench" / name, results / folder)
    status, err = tables(results, tmp_path / "out", capsys)
    assert status == 0
    assert err == [f"ignored 2 JSON file(s) that are no run records (no schema, no run_id) in "
                   f"{results / 'notes'}"]


def test_out_under_a_file_is_one_error_line_end_to_end(tmp_path):
    results = study_copy(tmp_path, "relu", "gelu")
    (tmp_path / "somefile.txt").write_text("x")
    done = subprocess.run([sys.executable, "-m", "xformer_bench.results", "--results-dir",
                           str(results), "--out", str(tmp_path / "somefile.txt" / "tables")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300,
                          env={**os.environ, "XBENCH_DEBUG": "0"})
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"error: cannot write tables to {tmp_path / 'somefile.txt' / 'tables'} "
        f"({tmp_path / 'somefile.txt'} is a file); choose another with --out"]


def test_a_records_missing_reference_table_is_one_error_line(tmp_path, capsys):
    results = study_copy(tmp_path, "relu", "gelu")
    for path in (results / STUDY).glob("*.json"):
        record = json.loads(path.read_text())
        record["config"]["rows_from"] = "no_such_table"
        path.write_text(json.dumps(record))
    status, err = tables(results, tmp_path / "out", capsys)
    assert status == 2 and len(err) == 1
    assert err[0].startswith("error: rows_from: no_such_table (run vanilla-full-layernorm-")
    assert "is no shipped reference table; shipped: " in err[0]


def test_a_studys_missing_reference_table_is_one_error_line(tmp_path, capsys, monkeypatch):
    declared = tmp_path / f"{STUDY}.yaml"
    declared.write_text("reference: no_such_table\n")
    monkeypatch.setattr(report, "study_path", lambda experiment: declared)
    status, err = tables(study_copy(tmp_path, "relu", "gelu"), tmp_path / "out", capsys)
    assert status == 2
    assert len(err) == 1 and err[0].startswith(
        f"error: {declared} declares reference: no_such_table, no shipped reference table")


@pytest.mark.parametrize("history, what", [
    ([1, 2, 3], "'history' point 0 is 1, not an object with a step"),
    ([{"val/bpb": 3.1}], "'history' point 0 has step None, not a finite number"),
    ([{"step": 38}, {"step": "late"}], "'history' point 1 has step 'late', not a finite number"),
])
def test_a_malformed_history_skips_its_record_by_name(tmp_path, capsys, history, what):
    results = study_copy(tmp_path, "relu", "gelu")
    planted = plant(results, "relu", "relu_bad_history",
                    lambda record: record.update(seed=3, history=history))
    status, err = tables(results, tmp_path / "out", capsys)  # plots read the history
    assert status == 0 and err == [f"skipped {planted}: {what}"]
    assert rows(tmp_path / "out")["ReLU"]["seeds_total"] == "3"


@pytest.mark.parametrize("timing, reason", [
    ('{"experiment": "narang_activations", "rows": [1, 2]', "unreadable JSON ("),  # truncated
    ('{"experiment": "narang_activations", "rows": [1, 2]}', "no 'experiment' name or no "
     "'rows' object"),
    ('{"experiment": "narang_activations", "rows": {"abc": {"label": "ReLU"}}}',
     "row 'abc' lacks a finite steps_per_sec, iqr or its rates"),
    ('{"experiment": "narang_activations", "conditions": [], "rows": {}}',
     "'conditions' is a list"),
])
def test_a_malformed_timing_json_is_named_and_the_runs_speed_shown(tmp_path, capsys, timing,
                                                                   reason):
    results = study_copy(tmp_path, "relu", "gelu")
    (results / STUDY / "timing.json").write_text(timing)
    status, err = tables(results, tmp_path / "out", capsys)
    assert status == 0 and len(err) == 1
    assert err[0].startswith(f"skipped {results / STUDY / 'timing.json'}: {reason}")
    assert err[0].endswith("; Step/s from the runs' own timings")
    assert float(rows(tmp_path / "out")["ReLU"]["steps_per_sec"]) > 0


def _make_table(results: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``make table`` on ``results`` (its venv taken as installed: a fresh stamp)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    stamp = tmp_path / "installed"
    stamp.touch()
    return subprocess.run(["make", "-s", "-C", str(ROOT), "table", f"TABLE_RESULTS={results}",
                           f"STAMP={stamp}", f"BIN={Path(sys.executable).parent}"],
                          capture_output=True, text=True, timeout=300)


def test_make_table_with_no_run_yet_says_so_and_succeeds(tmp_path):
    (tmp_path / "results").mkdir()
    done = _make_table(tmp_path / "results", tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"no run records under {tmp_path / 'results'} yet" in done.stderr


def test_make_table_fails_when_its_tables_fail(tmp_path):
    results = tmp_path / "results" / STUDY
    results.mkdir(parents=True)
    (results / "broken.json").write_text('{"schema": 2, "run_id": "broken"')  # truncated
    done = _make_table(tmp_path / "results", tmp_path)
    assert done.returncode != 0
    assert f"skipped {results / 'broken.json'}: unreadable JSON" in done.stderr
    assert "error: no valid run records under" in done.stderr and "Traceback" not in done.stderr
