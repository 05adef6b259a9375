"""A researcher's own studies, presets and options, without editing the package: a user config
folder (``XBENCH_CONF``, ``--config-dir``/``-cd``) searched by every part of xbench; a
``baseline=`` on the command line; a debugging run of another budget kept out of the study's
table."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from xformer_bench import config
from xformer_bench.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
XBENCH = [sys.executable, "-m", "xformer_bench.cli"]
SMOKE = (ROOT / "conf" / "experiment" / "smoke.yaml").read_text()
STUDY = SMOKE.replace("experiment_name: smoke", "experiment_name: my_study").replace(
    "      activation: relu,gelu\n      seed: 0,1\n",
    "      attention: full,my_local\n      seed: 0\n") + "baseline: {attention: full}\n"
OPTION = "name: local\nlabel: Local attention (window 8)\nfamily: fixed_pattern\nwindow: 8\n"
PRESET = ("# @package _global_\ndefaults:\n  - override /attention: my_local\n"
          "model:\n  name: my_preset\n  label: My preset\n  d_model: 48\n")


@pytest.fixture
def myconf(tmp_path: Path, monkeypatch) -> Path:
    """A user config folder with a study, an attention option and a model preset; not yet in
    ``XBENCH_CONF``."""
    folder = tmp_path / "myconf"
    for relative, text in (("experiment/my_study.yaml", STUDY),
                           ("attention/my_local.yaml", OPTION),
                           ("model/my_preset.yaml", PRESET)):
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(text)
    monkeypatch.delenv(config.USER_CONF, raising=False)
    assert "attention: full,my_local" in STUDY and "my_study" in STUDY  # smoke.yaml, edited
    return folder


def test_every_lookup_finds_the_user_folder(myconf, monkeypatch):
    from xformer_bench.hybrid_layout import attention_option
    from xformer_bench.ladder import study_overrides
    from xformer_bench.results.report import study_baseline
    from xformer_bench.schema.study import PRESETS

    assert config.find_config("attention", "my_local") is None and "my_preset" not in PRESETS
    monkeypatch.setenv(config.USER_CONF, os.pathsep.join([str(myconf), str(myconf / "absent")]))
    assert config.config_dirs() == (config.CONF_DIR, myconf)  # conf/ first, as Hydra reads
    assert config.find_config("attention", "my_local") == myconf / "attention" / "my_local.yaml"
    assert {"my_local", "local", "full"} <= set(config.options("attention"))
    assert "my_preset" in PRESETS and "vanilla" in PRESETS
    assert attention_option("my_local")["window"] == 8
    assert study_overrides("my_study") == ("experiment=my_study",)
    assert study_baseline("my_study") == {"attention": "full"}


def test_hydra_composes_the_user_option_preset_and_study(myconf, monkeypatch):
    monkeypatch.setenv(config.USER_CONF, str(myconf))
    assert config.compose_config("attention=my_local")["attention"]["window"] == 8
    preset = config.compose_config("model=my_preset")
    assert (preset["model"]["d_model"], preset["attention"]["name"]) == (48, "local")
    study = config.compose_config("experiment=my_study")
    assert (study["experiment_name"], study["trainer"]["max_steps"]) == ("my_study", 16)


def test_the_preflight_offers_and_accepts_the_user_option(myconf, monkeypatch):
    from xformer_bench.preflight import command_line_error

    error = command_line_error(["--config-dir", str(myconf), "attention=my_locl"])
    assert "did you mean attention=my_local?" in str(error) and "my_local" in str(error)
    assert command_line_error([f"--config-dir={myconf}", "attention=my_local"]) is None
    assert command_line_error(["-cd", str(myconf), "-m", "experiment=my_study"]) is None
    assert config.USER_CONF not in os.environ  # the check set it for itself only
    error = command_line_error(["experiment=my_study"])  # not searched: Hydra's options
    assert "experiment=my_study is not an option of experiment" in str(error)
    monkeypatch.setenv(config.USER_CONF, str(myconf))
    assert command_line_error(["-m", "experiment=my_study"]) is None


def test_the_planner_lists_the_user_studys_jobs(myconf, monkeypatch):
    from xformer_bench.sweep_plan import planned_jobs

    monkeypatch.setenv(config.USER_CONF, str(myconf))
    jobs = planned_jobs(["-m", "experiment=my_study"])
    assert jobs == [["attention=full", "seed=0", "experiment=my_study"],
                    ["attention=my_local", "seed=0", "experiment=my_study"]]


def test_a_missing_folder_or_a_file_named_as_the_packages_is_one_line(myconf, tmp_path,
                                                                      monkeypatch):
    from xformer_bench.preflight import command_line_error

    error = command_line_error(["--config-dir", str(tmp_path / "nope"), "seed=1"])
    assert isinstance(error, ConfigError) and "is not a folder" in str(error)
    with pytest.raises(ConfigError, match="needs a folder"):
        config.take_config_dirs(["seed=1", "-cd"])
    assert config.take_config_dirs(["-m", "-cd", "a", "--config-dir=b", "x=1"]) == \
        (["a", "b"], ["-m", "x=1"])
    (myconf / "attention" / "local.yaml").write_text(OPTION)  # Hydra would read conf/'s
    error = command_line_error(["-cd", str(myconf), "attention=local"])
    assert "has the name of xbench's conf/attention/local.yaml" in str(error)
    assert "rename yours, e.g. attention/my_local.yaml" in str(error)


def test_hydra_reads_the_package_file_first(tmp_path):
    """The precedence xbench's own lookups follow (and why a clash is refused): conf/ is
    Hydra's primary folder, a searched folder comes after it."""
    from hydra import compose, initialize_config_dir

    (tmp_path / "attention").mkdir()
    (tmp_path / "attention" / "local.yaml").write_text(OPTION)
    with initialize_config_dir(config_dir=str(config.CONF_DIR), version_base="1.3"):
        composed = compose(config_name="config", overrides=[
            "attention=local", f"hydra.searchpath=[file://{tmp_path}]"])
    assert composed.attention.window == 256  # conf/attention/local.yaml's, not the user's


def test_baseline_is_settable_on_the_command_line():
    from xformer_bench.preflight import command_line_error

    assert command_line_error(["-m", "activation=relu,gelu", "baseline={activation: relu}",
                               "experiment_name=my_compare"]) is None
    assert config.compose_config("baseline={activation: relu}")["baseline"] == \
        {"activation": "relu"}
    assert config.compose_config()["baseline"] is None


def test_the_table_takes_the_command_lines_baseline_then_the_studys():
    from xformer_bench.results.report import table_baseline

    def run(baseline, *overrides):
        return {"config": {"baseline": baseline}, "overrides": list(overrides)}

    given = [run({"activation": "gelu"}, "baseline={activation: gelu}")] * 2
    assert table_baseline("narang_activations", given) == {"activation": "gelu"}
    assert table_baseline("narang_activations", [run({"activation": "gelu"})]) == \
        {"activation": "relu"}  # no command line: the study's declaration, edited or not
    assert table_baseline("my_compare", [run({"activation": "relu"})] * 2) == \
        {"activation": "relu"}  # no study file: what the runs hold
    assert table_baseline("my_compare", [run(None), run({"activation": "relu"})]) is None


SHIPPED = ROOT / "results" / "reference" / "narang_activations_300_steps_tinyshakespeare" / "records"


def test_a_debugging_run_of_fewer_steps_is_its_own_table_not_a_row(tmp_path, capsys):
    """Before, it was a row of the study's table ("ReLU, trainer.max_steps=2")."""
    from xformer_bench.results.__main__ import main

    folder = tmp_path / "results" / "narang_activations"
    folder.mkdir(parents=True)
    for activation in ("relu", "gelu"):
        for path in (SHIPPED / "narang_activations").glob(f"*-{activation}-*.json"):
            shutil.copy(path, folder)
    record = json.loads(sorted(folder.glob("*-relu-*_s0_*.json"))[0].read_text())
    record["overrides"].append("trainer.max_steps=2")  # xbench experiment=... trainer.max_steps=2
    record["config"]["trainer"]["max_steps"] = record["steps"] = 2
    record["run_id"] = "relu_debug"
    (folder / "relu_debug.json").write_text(json.dumps(record))
    out = tmp_path / "out"
    assert main(["--results-dir", str(tmp_path / "results"), "--out", str(out), "--no-plots"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == ["warning: narang_activations: a separate setup: 1 run on text differs from "
                   "the study's runs in trainer.max_steps 2 (not 300): not set beside them; "
                   "their own table, narang_activations__max_steps_2"]
    study = (out / "narang_activations.md").read_text()
    assert "max_steps=2" not in study and "| ReLU |" in study and "| GeLU |" in study
    apart = (out / "narang_activations__max_steps_2.md").read_text()
    assert "Not in the narang_activations table: a separate setup" in apart


def xbench(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != config.USER_CONF}
    done = subprocess.run([*XBENCH, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**environment, "XBENCH_DATA_DIR": str(cwd / "data"),
                                            **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_dry_run_lists_the_user_studys_jobs_with_config_dir(myconf, tmp_path):
    done = xbench("-m", "--config-dir", str(myconf), "experiment=my_study", "--dry-run",
                  cwd=tmp_path)
    assert "1/2 attention=full seed=0 experiment=my_study" in done.stdout
    assert "2/2 attention=my_local seed=0 experiment=my_study" in done.stdout
    assert "dry run: 2 jobs: 2 to run" in done.stdout


def tables(results: Path, out: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "xformer_bench.results", "--results-dir",
                           str(results), "--out", str(out), "--no-plots"], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.slow
def test_a_user_study_runs_and_a_debugging_run_stays_out_of_its_table(myconf, tmp_path):
    xbench("-m", "experiment=my_study", "logger=none", cwd=tmp_path, XBENCH_CONF=str(myconf))
    xbench("-cd", str(myconf), "experiment=my_study", "logger=none", "trainer.max_steps=2",
           cwd=tmp_path)
    err = tables(tmp_path / "results", tmp_path / "tables")
    assert "their own table, my_study__max_steps_2" in err
    study = (tmp_path / "tables" / "my_study.md").read_text()
    assert "| Local attention (window 8) |" in study and "| Full attention |" in study
    assert study.count("| Full attention") == 1  # not "Full attention, trainer.max_steps=2"
    assert "differs from the baseline row, Full attention" in study  # the study's baseline
    assert (tmp_path / "tables" / "my_study__max_steps_2.md").is_file()


@pytest.mark.slow
def test_a_baseline_on_the_command_line_gives_the_table_significance_and_a_noise_floor(
        tmp_path):
    xbench("-m", "activation=relu,gelu", "seed=0,1", "baseline={activation: relu}",
           "experiment_name=my_compare", "model.d_model=32", "model.n_layers=1",
           "model.n_heads=2", "model.d_ff=64", "data.size=20000", "data.seq_len=32",
           "data.batch_size=4", "trainer.max_steps=8", "optim.warmup_steps=2",
           "trainer.progress_bar=false", "logger=none", cwd=tmp_path)
    tables(tmp_path / "results", tmp_path / "tables")
    table = (tmp_path / "tables" / "my_compare.md").read_text()
    assert "differs from the baseline row, ReLU, by Welch's t-test" in table
    assert "the noise floor: Early loss" in table
