"""The README's first command and what a sweep tells its user: ``xbench`` with no
arguments trains and records; a sweep prints ``k/N``, ends with a summary and exits non-zero
when a job was refused; ``--dry-run`` (and ``--cfg`` with ``-m``) lists the jobs, training
nothing; ``--cfg job`` runs the preflight first."""

from __future__ import annotations

import json
import sys

import pytest

from conftest import TINY_RUN, xbench
from xformer_bench import cli


def test_xbench_with_no_arguments_trains_the_default_run_and_writes_its_record(
        tmp_path, monkeypatch, capsys):
    """The console entry point, in-process, with an empty argv: the regression of the ablation
    ladders (an empty command line planned as a row not run) is caught here, fast."""
    real_run_job = cli.run_job
    shrunk = {}

    def tiny(config, choices, overrides, run_dir, multirun):  # the default run, a few steps
        assert overrides == []  # nothing on the command line
        for item in TINY_RUN:
            key, value = item.split("=")
            if key == "logger":
                continue
            node, leaf = key.split(".")
            config[node][leaf] = type(config[node][leaf])(value) if value not in (
                "false", "true") else value == "true"
        config["trainer"]["max_steps"] = 3
        shrunk["config"] = config
        return real_run_job(config, choices, overrides, run_dir, multirun)

    monkeypatch.setattr(cli, "run_job", tiny)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XBENCH_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setattr(sys, "argv", ["xbench"])
    cli.main()
    out = capsys.readouterr().out
    assert "final val bpb" in out and "[xbench] record:" in out
    [record_path] = (tmp_path / "results" / "default").glob("*.json")
    record = json.loads(record_path.read_text())
    assert record["status"] == "finished" and record["steps"] == 3
    assert record["choices"]["model"] == "vanilla" and record["choices"]["data"] == "synthetic"
    assert shrunk["config"]["trainer"]["max_steps"] == 3


@pytest.mark.parametrize("argv, note", [
    (["experiment=smoke"], "[xbench] note: experiment=smoke sweeps 4 jobs; without -m this runs "
                           "one (the study's defaults): add -m to run them all"),
    (["experiment=narang_activations"], "sweeps 39 jobs"),  # sweep: behind ${sweep}
    (["activation=relu"], None),
])
def test_a_study_run_without_m_says_it_runs_one_of_its_jobs(argv, note, tmp_path, monkeypatch,
                                                            capsys):
    """``xbench experiment=smoke`` ran one of its 4 jobs and said nothing (the study looked
    done); the note comes before the job (here a stub: nothing trains)."""
    from hydra.core.global_hydra import GlobalHydra

    jobs = []
    monkeypatch.setattr(cli, "run_job", lambda *args, **kwargs: jobs.append(args))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["xbench", *argv])
    GlobalHydra.instance().clear()
    try:
        cli.main()
    finally:
        GlobalHydra.instance().clear()
    notes = [line for line in capsys.readouterr().out.splitlines() if "note:" in line]
    assert len(jobs) == 1
    assert (notes == []) if note is None else (len(notes) == 1 and note in notes[0])


def test_a_sweep_with_a_refused_job_counts_it_names_it_and_exits_non_zero(tmp_path):
    result = xbench("-m", *TINY_RUN, "trainer.max_steps=2", "attention=full,linformer",
                    cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "[xbench] job 1/2" in result.stdout and "[xbench] job 2/2" in result.stdout
    summary = result.stderr[result.stderr.index("[xbench] sweep:"):]
    assert "2 of 2 jobs" in summary and "1 finished" in summary and "1 refused" in summary
    assert "job 2 refused: attention=linformer -- a decoder-only LM needs causal" in summary
    assert "Traceback" not in result.stderr
    assert len(list((tmp_path / "results").rglob("*.json"))) == 1  # full's record only


@pytest.mark.slow  # a whole sweep in a subprocess: make test-full
def test_a_sweep_whose_every_job_fails_on_missing_data_exits_non_zero(tmp_path):
    result = xbench("-m", "activation=relu,gelu", "data=text", *TINY_RUN[1:], cwd=tmp_path)
    assert result.returncode == 2, result.stdout[-2000:]
    assert "2 refused" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("flags", [["--dry-run"], pytest.param(["--cfg", "job"],
                                                                marks=pytest.mark.slow)])
def test_dry_run_lists_every_job_with_its_run_id_and_trains_nothing(tmp_path, flags):
    result = xbench("-m", "experiment=smoke", *flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    jobs = [line for line in lines if line.strip().startswith(("1/4", "2/4", "3/4", "4/4"))]
    assert len(jobs) == 4 and "activation=relu seed=0" in jobs[0]
    assert sum(": run" in line for line in lines) == 4
    assert "dry run: 4 jobs: 4 to run" in lines[-1]
    assert "[xbench] budget: 16 steps of 4 x 32 (2,048 positions) a run" in lines
    assert not any("GPU budget" in line for line in lines)  # smoke declares none
    assert not any("One model" in line for line in lines)  # relu and gelu: two models
    assert not (tmp_path / "results").exists() and not (tmp_path / "multirun").exists()


def test_a_study_declares_its_gpu_budget_one_override_set_away():
    from xformer_bench.sweep_plan import budget_lines

    cpu, gpu = budget_lines(["experiment=narang_table1", "seed=0"])
    assert cpu == "[xbench] budget: 2000 steps of 16 x 128 (4,096,000 positions) a run"
    assert gpu.startswith("[xbench] GPU budget: xbench -m experiment=narang_table1 data=enwik8 ")
    assert "trainer.max_steps=20000" in gpu


def test_cfg_job_runs_the_preflight_first(tmp_path):
    result = xbench("--cfg", "job", "model.d_modle=64", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: model.d_modle is not a key of model: did you mean model.d_model=64?"]


def test_a_study_that_sets_its_own_window_keeps_it_in_its_gpu_budget():
    """narang_base's GPU budget sets 512-byte windows: a study of another length (the long-context
    ones, at 2048) that inherited it would run its GPU budget at 512, another study."""
    from omegaconf import OmegaConf

    from conftest import compose_config
    from xformer_bench.config import CONF_DIR

    checked = 0
    for path in sorted((CONF_DIR / "experiment").glob("*.yaml")):
        own = OmegaConf.to_container(OmegaConf.load(path))
        length = (own.get("data") or {}).get("seq_len")
        study = compose_config(f"experiment={path.stem}")
        if length is None or path.stem == "narang_base" or not study.get("gpu_budget"):
            continue
        gpu = compose_config(f"experiment={path.stem}", *study["gpu_budget"])
        assert gpu["data"]["seq_len"] == length, (path.stem, study["gpu_budget"])
        checked += 1
    assert checked >= 2  # attention_zoo_long, modern_mixers
