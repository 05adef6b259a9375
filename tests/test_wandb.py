"""`logger=wandb`: offline by itself without an account; one W&B run per xbench run, grouped by
study, typed by row, tagged by choice, its summary the record's headline numbers; a sweep's
offline runs in one folder, with one `wandb sync` for all of them.

The offline runs are read back from their ``.wandb`` files: wandb (0.31) reads them only in its
Go core, so the file's LevelDB-style framing is undone here and each record decoded with
wandb's own protobuf messages (:mod:`wandb.proto`)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import TINY_RUN, compose_config, xbench
from xformer_bench.config import choice_groups
from xformer_bench.results.record import load, run_identity
from xformer_bench.run import execute
from xformer_bench.training.wandb_logger import resolve_mode

CHOICES = {"model:vanilla", "attention:full", "norm:layernorm", "activation:gelu",
           "position:sinusoidal", "ffn:dense", "stack:standard", "embedding:lookup",
           "head:softmax", "data:synthetic"}


def _wandb_records(path: Path) -> list:
    """The protobuf records of an offline run file (``run-<id>.wandb``, a LevelDB-style log:
    a 7-byte file header, then 32 KiB blocks of chunks with a 7-byte header each)."""
    from wandb.proto import wandb_internal_pb2

    raw, block, pos, chunks, out = path.read_bytes(), 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # block trailer: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0:  # zero-filled rest of a block
            pos += block - pos % block
            continue
        chunks, pos = chunks + raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            out.append(record)
            chunks = b""
    return out


def _items(items) -> dict:
    return {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in items}


def _offline_run(run_folder: Path) -> dict:
    """What W&B would show of an offline run: group, job type, name, tags, config, and the
    summary (each logged metric's last value, then what the run put in its summary)."""
    [run_file] = run_folder.glob("run-*.wandb")
    found: dict = {"summary": {}}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.update(group=record.run.run_group, job_type=record.run.job_type,
                         name=record.run.display_name, tags=list(record.run.tags),
                         config=_items(record.run.config.update))
        elif kind == "history":
            found["summary"].update(_items(record.history.item))
        elif kind == "summary":
            found["summary"].update(_items(record.summary.update))
        elif kind == "config":
            found["config"].update(_items(record.config.update))
    found["config"].pop("_wandb", None)  # wandb's own bookkeeping, hidden in its exports too
    return found


def _run(tmp_path: Path, *job: str) -> dict:
    """One job as a sweep runs it, in its own folder under ``multirun/``."""
    overrides = (*TINY_RUN, "logger=wandb", "logger.tags=[paper,smoke]", "experiment_name=study",
                 f"paths.results_dir={tmp_path / 'results'}", *job)
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    return execute(config, choices, list(overrides), tmp_path / "multirun" / "_".join(job))


def _hints(capsys) -> list[Path]:
    out = capsys.readouterr().out.splitlines()
    return [Path(line.split("wandb sync ")[1]) for line in out if "wandb sync" in line]


def _assert_logged(run: dict, record: dict) -> None:
    """The W&B run says what the record says: its study, name, config and headline numbers."""
    assert run["group"] == "study" and run["name"] == record["run_id"]
    assert run["config"] == json.loads(json.dumps(record["config"], default=str))
    assert "activation.name" not in run["config"] and run["config"]["activation"]["name"]
    summary = run["summary"]
    for key in ("status", "params", "active_params", "flops_per_step", "step_memory_mb",
                "steps", "primary_metric"):
        assert summary[key] == record[key], key
    assert summary["status"] == "finished" and summary["params"] > 0
    metric = record["primary_metric"]  # the numbers `make table` averages
    assert summary[f"final/val/{metric}"] == record["final"][f"val/{metric}"]
    assert summary[f"test/{metric}"] == record["test"][f"test/{metric}"]
    assert summary["final/step"] == record["final"]["step"] == 16


@pytest.fixture
def no_account(monkeypatch, tmp_path):
    """No WANDB_MODE, no API key, an empty netrc: what a fresh laptop or cluster node has."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_a_single_run_is_one_offline_wandb_run_that_says_what_its_record_says(
        tmp_path, no_account, capsys):
    record = _run(tmp_path, "seed=0")
    [folder] = _hints(capsys)  # a single run: its own hint, its own folder
    assert folder.parent == Path(record["run_dir"]) / "wandb"
    assert folder.name.startswith("offline-run-")
    run = _offline_run(folder)
    _assert_logged(run, record)
    assert run["tags"][:2] == ["paper", "smoke"] and set(run["tags"][2:]) == CHOICES
    assert run["job_type"].startswith("vanilla-full-layernorm-gelu-sinusoidal_")


def test_a_failed_run_says_so_in_its_summary(tmp_path, no_account, capsys, monkeypatch):
    from lightning.pytorch import Trainer

    def broken(*args, **kwargs):
        raise RuntimeError("out of luck")

    monkeypatch.setattr(Trainer, "test", broken)  # trained, then fails
    with pytest.raises(RuntimeError, match="out of luck"):
        _run(tmp_path, "seed=0")
    [record] = map(load, (tmp_path / "results" / "study").glob("*.json"))
    [folder] = _hints(capsys)
    summary = _offline_run(folder)["summary"]
    assert summary["status"] == record["status"] == "failed"
    assert summary["error"] == record["error"] == "RuntimeError: out of luck"
    assert summary["final/val/bpb"] == record["final"]["val/bpb"] and record["test"] is None


@pytest.mark.slow  # a 4-job sweep in a subprocess: make test-full
def test_a_sweep_keeps_its_offline_runs_in_one_folder_with_one_sync_hint(tmp_path, no_account,
                                                                         monkeypatch):
    monkeypatch.delenv("WANDB_SERVICE", raising=False)  # its own wandb-core, not this process's
    result = xbench("-m", *TINY_RUN, "logger=wandb", "logger.tags=[paper,smoke]",
                    "experiment_name=study", "seed=0,1", "activation=gelu,relu", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    [hint] = [line for line in result.stdout.splitlines() if "wandb sync" in line]
    assert "ran 4 run(s) of this sweep offline" in hint
    folder = Path(hint.split("wandb sync ")[1])
    [sweep] = (tmp_path / "multirun" / "study").iterdir()
    assert folder == sweep / "wandb" and not list(sweep.glob("*/wandb"))  # not each job's
    runs = {run["name"]: run for run in map(_offline_run, folder.glob("offline-*"))}
    records = {r["run_id"]: r for r in map(load, (tmp_path / "results" / "study").glob("*.json"))}
    assert sorted(runs) == sorted(records) and len(runs) == 4
    rows: dict[str, set] = {}
    for run_id, record in records.items():
        _assert_logged(runs[run_id], record)
        assert f"activation:{record['choices']['activation']}" in runs[run_id]["tags"]
        rows.setdefault(runs[run_id]["job_type"], set()).add(
            (record["choices"]["activation"], record["seed"]))
    assert sorted(rows.values(), key=sorted) == [{("gelu", 0), ("gelu", 1)},
                                                 {("relu", 0), ("relu", 1)}]  # a row: its seeds


def test_logging_to_wandb_keeps_the_run_id():
    plain = compose_config(*TINY_RUN)
    logged = compose_config(*TINY_RUN, "logger=wandb", "logger.tags=[paper]",
                            "logger.project=elsewhere", "logger.mode=offline")
    choices = {g: plain[g]["name"] for g in ("model", "attention", "norm", "activation",
                                             "position")}
    assert run_identity(logged, {**choices, "logger": "wandb"}) == run_identity(plain, choices)


@pytest.mark.parametrize("configured, env, netrc_entry, expected", [
    ("auto", {}, False, "offline"),
    ("auto", {}, True, "online"),
    ("auto", {"WANDB_API_KEY": "k" * 40}, False, "online"),
    ("auto", {"WANDB_API_KEY": "k" * 40, "WANDB_MODE": "offline"}, False, "offline"),
    ("auto", {"WANDB_MODE": "disabled"}, True, "disabled"),
    ("offline", {"WANDB_API_KEY": "k" * 40}, True, "offline"),
])
def test_mode_auto_goes_online_only_with_an_api_key(configured, env, netrc_entry, expected,
                                                    no_account, monkeypatch):
    if netrc_entry:
        no_account.write_text("machine api.wandb.ai\n  login user\n  password " + "k" * 40 + "\n")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert resolve_mode(configured) == expected


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="logger.mode='cloud'; choose one of: auto, online"):
        resolve_mode("cloud")
