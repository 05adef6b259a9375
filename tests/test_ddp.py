"""Past one machine: Lightning DDP through the CLI, and the SLURM launcher's config."""

from __future__ import annotations

import os

import pytest

from conftest import TINY_RUN, run_tiny
from conftest import xbench as _xbench
from xformer_bench.cli import CONF_DIR
from xformer_bench.results import record as records


@pytest.mark.slow
def test_ddp_sweep_on_cpu_writes_one_record_per_job_with_single_process_eval_counts(tmp_path):
    single = run_tiny(tmp_path / "single")
    result = _xbench("-m", *TINY_RUN, "experiment_name=ddp", "seed=0,1", "trainer=ddp",
                     "trainer.accelerator=cpu", "trainer.devices=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    done = [records.load(p) for p in sorted((tmp_path / "results" / "ddp").glob("*.json"))]
    assert sorted(r["seed"] for r in done) == [0, 1]  # rank 1 wrote none, nor re-ran the sweep
    [sweep] = (tmp_path / "multirun" / "ddp").iterdir()
    assert sorted(r["run_dir"] for r in done) == [str(sweep / "0"), str(sweep / "1")]
    assert not (tmp_path / "outputs").exists()  # the spawned ranks made no run directory
    for record in done:
        assert record["status"] == "finished" and record["steps"] == 16
        assert record["choices"]["trainer"] == "ddp" and record["config"]["trainer"]["devices"] == 2
        assert record["eval_counts"] == single["eval_counts"] == {"val": 999, "test": 999}
        assert record["tokens_per_sec"] == pytest.approx(record["steps_per_sec"] * 4 * 32 * 2)
        assert record["flops_per_step"] == 2 * single["flops_per_step"]


@pytest.mark.filterwarnings("ignore:(?s).*validated against ConfigStore schema")
def test_slurm_launcher_submits_one_task_and_gpu_per_ddp_rank(tmp_path, monkeypatch):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher",
                        reason="optional extra: pip install 'xformer_bench[slurm]'")
    import submitit
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    fake_bin = tmp_path / "bin"  # submitit wants srun on PATH; nothing is submitted
    fake_bin.mkdir()
    (fake_bin / "srun").write_text("#!/bin/sh\nexit 1\n")
    (fake_bin / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}:{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    submitted = {}

    def map_array(executor, fn, *args):
        submitted.update(executor._executor.parameters, jobs=len(args[0]))
        return []

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", map_array)
    overrides = ["hydra/launcher=submitit_slurm", "trainer=ddp", "trainer.devices=4",
                 "trainer.num_nodes=2", "hydra.launcher.partition=gpu", "experiment_name=big"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    launcher.launch([["seed=0"], ["seed=1"]], initial_job_idx=0)
    assert submitted["jobs"] == 2
    assert {k: submitted[k] for k in ("nodes", "ntasks_per_node", "gpus_per_node", "partition",
                                       "job_name")} == {
        "nodes": 2, "ntasks_per_node": 4, "gpus_per_node": 4, "partition": "gpu",
        "job_name": "xbench-big"}


def test_fsdp_is_ddp_launched_with_lightnings_fsdp_strategy():
    from conftest import compose_config

    fsdp, ddp = compose_config("trainer=fsdp"), compose_config("trainer=ddp")
    assert fsdp["trainer"]["strategy"] == "fsdp"
    assert {**fsdp["trainer"], "strategy": "ddp"} == ddp["trainer"]


@pytest.mark.skipif(not __import__("torch").cuda.is_available() or
                    __import__("torch").cuda.device_count() < 2, reason="needs 2 GPUs")
def test_fsdp_trains_on_two_gpus(tmp_path):  # Lightning's FSDP refuses CPUs
    result = _xbench(*TINY_RUN, "experiment_name=fsdp", "trainer=fsdp", "trainer.devices=2",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    [path] = (tmp_path / "results" / "fsdp").glob("*.json")
    assert records.load(path)["status"] == "finished"
