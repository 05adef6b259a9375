"""Every folder a run will write -- records and claims, resume points, the run directory -- is
checked before the run: one line naming the key that moves it, never a traceback
from the code that first writes there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import compose_config, xbench
from xformer_bench import cli
from xformer_bench.preflight import command_line_error


@pytest.fixture
def a_file(tmp_path) -> Path:
    path = tmp_path / "a_file"
    path.write_text("not a folder")
    return path


@pytest.mark.parametrize("arguments, key", [
    (("paths.results_dir={file}/results",), "paths.results_dir"),
    (("paths.checkpoint_dir={file}/checkpoints",), "paths.checkpoint_dir"),
    (("paths.results_dir={tmp}", "experiment_name=a_file"), "paths.results_dir"),
    (("hydra.run.dir={file}/run",), "hydra.run.dir"),
    (("-m", "seed=0,1", "hydra.sweep.dir={file}/sweep"), "hydra.sweep.dir"),
])
def test_a_folder_under_a_file_is_one_line_naming_its_key(arguments, key, a_file, tmp_path,
                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a.format(file=a_file, tmp=tmp_path) for a in arguments]
    error = str(command_line_error(argv))
    assert error.startswith("cannot write ") and f"({a_file} is a file)" in error
    assert error.endswith(f"choose another with {key}=...") and "\n" not in error
    assert not any(p.name.startswith(".xbench-write-test") for p in tmp_path.iterdir())


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    error = str(command_line_error([f"paths.results_dir={locked}/results"]))
    assert error.startswith(f"cannot write run records to {locked}/results/default")


def test_a_sweeps_job_is_refused_before_its_claim(a_file, tmp_path, capsys):
    """Where the claim code once raised a traceback (its parent a file)."""
    overrides = [f"paths.results_dir={a_file}/results"]
    config = compose_config(*overrides)
    with pytest.raises(SystemExit) as exit_:
        cli.run_job(config, {"model": "vanilla"}, overrides, tmp_path / "run", multirun=False)
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: cannot write run records to ")
    assert line.endswith("choose another with paths.results_dir=...")


def test_end_to_end_exit_2_without_a_traceback(a_file, tmp_path):
    result = xbench(f"paths.results_dir={a_file}/results", cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr
    assert "paths.results_dir=..." in errors[0] and not (tmp_path / "outputs").exists()
