"""`logger=wandb`: offline by itself without an account; one W&B run per xbench run."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from conftest import TINY_RUN, compose_config
from xformer_bench.run import execute
from xformer_bench.training.wandb_logger import resolve_mode

CHOICE_KEYS = ("model", "attention", "norm", "activation", "position", "ffn", "data")


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
    return {item.key or ".".join(item.nested_key): json.loads(item.value_json) for item in items}


def _offline_run(run_folder: Path) -> dict:
    """Group, name, tags, config and logged metrics (last value per key) of an offline run."""
    [run_file] = run_folder.glob("run-*.wandb")
    found: dict = {"metrics": {}}
    for record in _wandb_records(run_file):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.update(group=record.run.run_group, name=record.run.display_name,
                         tags=list(record.run.tags),
                         config=_items(record.run.config.update))
        elif kind == "history":
            found["metrics"].update(_items(record.history.item))
    return found


def _run(tmp_path: Path, *overrides: str) -> dict:
    overrides = (*TINY_RUN, "logger=wandb", "logger.tags=[paper,smoke]", "experiment_name=study",
                 f"paths.results_dir={tmp_path / 'results'}", *overrides)
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in CHOICE_KEYS}
    return execute(config, choices, list(overrides), tmp_path / f"run_s{config['seed']}")


@pytest.fixture
def no_account(monkeypatch, tmp_path):
    """No WANDB_MODE, no API key, an empty netrc: what a fresh laptop or cluster node has."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    netrc = tmp_path / "netrc"
    netrc.write_text("")
    monkeypatch.setenv("NETRC", str(netrc))
    return netrc


def test_without_an_account_each_run_is_its_own_offline_wandb_run(tmp_path, no_account, capsys):
    first = _run(tmp_path, "seed=0")
    second = _run(tmp_path, "seed=1")  # as the next job of a sweep, in the same process
    hints = [line for line in capsys.readouterr().out.splitlines() if "wandb sync" in line]
    assert len(hints) == 2
    folders = [Path(line.split("wandb sync ")[1]) for line in hints]
    for record, folder in zip((first, second), folders):
        assert folder.parent == Path(record["run_dir"]) / "wandb"
        assert folder.name.startswith("offline-run-")
        run = _offline_run(folder)
        assert run["group"] == "study" and run["tags"] == ["paper", "smoke"]
        assert run["name"] == record["run_id"]
        assert {k: run["config"][k] for k in CHOICE_KEYS} == {
            "model": "vanilla", "attention": "full", "norm": "layernorm", "activation": "gelu",
            "position": "sinusoidal", "ffn": "dense", "data": "synthetic"}
        assert run["config"]["model.d_model"] == 32 and run["config"]["seed"] == record["seed"]
        assert run["metrics"]["val/bpb"] == pytest.approx(record["final"]["val/bpb"])
        assert run["metrics"]["test/bpb"] == pytest.approx(record["test"]["test/bpb"])
        assert run["metrics"]["trainer/global_step"] == 16
    assert folders[0] != folders[1]


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
