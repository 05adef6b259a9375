"""``make table`` renders the user's results only, quietly; ``make references`` re-renders each
shipped reference into its own folder; a failure fails either (non-zero exit).

``make table`` is ``xbench-table --results-dir results --out results/tables --allow-empty``:
``results/bench`` (benchmark JSON, no run records) and ``results/reference`` (the shipped
studies) are not descended into, so neither is named nor rendered there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xformer_bench.results.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "results" / "reference" / "narang_activations_300_steps_tinyshakespeare" / "records"
STUDY = "narang_activations"


def _copy_runs(into: Path, *activations: str) -> None:
    into.mkdir(parents=True, exist_ok=True)
    for activation in activations:
        for path in sorted((SHIPPED / STUDY).glob(f"*-{activation}-sinusoidal_s[01]_*.json")):
            shutil.copy(path, into / path.name)


def _results(tmp_path: Path) -> Path:
    """A results folder as a user's: one study's runs, benchmark JSON under bench/ (one of
    them looking like a broken record), and a shipped reference under reference/."""
    results = tmp_path / "results"
    _copy_runs(results / STUDY, "relu")
    bench = results / "bench"
    bench.mkdir(parents=True)
    (bench / "train.json").write_text(json.dumps({"setting": {}, "rows": []}))
    (bench / "x.json").write_text(json.dumps({"schema": 2, "rows": []}))  # would be "lacks"
    _copy_runs(results / "reference" / "fake_ref" / "records" / STUDY, "relu", "gelu")
    return results


def test_make_table_reads_only_the_users_results_and_says_nothing_of_the_rest(tmp_path,
                                                                               capsys):
    results = _results(tmp_path)
    assert main(["--results-dir", str(results), "--out", str(results / "tables"),
                 "--allow-empty", "--no-plots"]) == 0
    out, err = capsys.readouterr()
    assert "skipped" not in err and "ignored" not in err and "bench" not in err
    assert sorted(p.name for p in (results / "tables").iterdir()) == [
        f"{STUDY}.{s}" for s in ("csv", "md", "tex")]
    assert "GeLU" not in (results / "tables" / f"{STUDY}.md").read_text()  # the reference's
    assert sorted(p.name for p in (results / "reference" / "fake_ref").iterdir()) == ["records"]
    assert out.split() == [str(results / "tables" / f"{STUDY}.{s}") for s in ("md", "tex", "csv")]


def _make(target: str, results: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    """``make <target>`` on ``results`` (its venv taken as installed: a fresh stamp)."""
    if shutil.which("make") is None:
        pytest.skip("no make")
    stamp = tmp_path / "installed"
    stamp.touch()
    return subprocess.run(["make", "-s", "-C", str(ROOT), target, f"TABLE_RESULTS={results}",
                           f"STAMP={stamp}", f"BIN={Path(sys.executable).parent}"],
                          capture_output=True, text=True, timeout=300)


def test_make_table_and_make_references_each_render_their_own(tmp_path):
    results = _results(tmp_path)
    incomplete = results / "reference" / "half_ref"
    _copy_runs(incomplete / "records" / STUDY, "relu")
    (incomplete / "INCOMPLETE").write_text("2 of 13 rows run\n")
    reference = results / "reference" / "fake_ref"

    done = _make("table", results, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "skipped" not in done.stderr and "fake_ref" not in done.stdout + done.stderr
    assert (results / "tables" / f"{STUDY}_curves.png").is_file()
    assert not (reference / f"{STUDY}.md").exists()  # references are not make table's

    done = _make("references", results, tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"{reference / 'records'} -> {reference}" in done.stdout
    assert f"skip {incomplete}: 2 of 13 rows run" in done.stdout
    table = (reference / f"{STUDY}.md").read_text()
    assert "ReLU" in table and "GeLU" in table
    assert (reference / f"{STUDY}_delta.png").is_file()  # its baseline, ReLU, declared
    assert not (incomplete / f"{STUDY}.md").exists()
    assert not (results / "tables" / "fake_ref").exists()


def test_make_references_fails_when_a_reference_fails_and_still_renders_the_others(tmp_path):
    results = tmp_path / "results"
    broken = results / "reference" / "a_broken" / "records" / STUDY
    broken.mkdir(parents=True)
    (broken / "run.json").write_text('{"schema": 2, "run_id": "run"')  # truncated
    _copy_runs(results / "reference" / "b_fine" / "records" / STUDY, "relu")
    done = _make("references", results, tmp_path)
    assert done.returncode != 0
    assert "error: no valid run records under" in done.stderr
    assert f"error: {broken.parent}: the tables failed" in done.stderr
    assert (results / "reference" / "b_fine" / f"{STUDY}.md").is_file()
