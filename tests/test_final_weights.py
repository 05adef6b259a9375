"""Final weights kept by default (``trainer.keep_weights``): a finished tiny run writes its model's
tensors beside its resume points, which the finish deletes while the weights stay; the record
names them; ``xbench-sample RECORD`` (and ``final.pt`` itself) samples them with the trained
model's logits; the off switch writes nothing; the key leaves the run id alone; a record with no
weights is one ``error:`` line whose command, run, keeps them under the same run id."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN, compose_config, run_tiny
from xformer_bench.config import choice_groups
from xformer_bench.errors import ConfigError
from xformer_bench.hardware import resolve_precision
from xformer_bench.results.record import run_identity
from xformer_bench.run_weights import load_model, locate
from xformer_bench.sample import main
from xformer_bench.schema import check_config
from xformer_bench.training import final_weights
from xformer_bench.training.final_weights import AUTO_MAX_PARAMS, FILENAME, wanted

RUN = ("trainer.max_steps=4", "trainer.val_checks=2", "resume=auto", "trainer.checkpoint_every=1")
"""Resume points at every step: the finish deletes them and must leave the weights."""
TOKENS = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))  # (B, T)


def _choices(config: dict) -> dict:
    return {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}


def _record_path(tmp_path: Path, record: dict) -> Path:
    return tmp_path / "results" / "default" / f"{record['run_id']}.json"


@pytest.fixture(scope="module")
def kept(tmp_path_factory):
    """A tiny run with the default key: its record, record path, and the trained model's state
    and logits on TOKENS, taken as the weights are kept."""
    tmp_path = tmp_path_factory.mktemp("kept")
    seen = {}
    keep = final_weights.keep_final_weights

    def spying(config, record, trainer, warn=print):
        model = trainer.lightning_module.model
        training = model.training
        model.eval()
        with torch.no_grad():
            seen["logits"] = model(TOKENS).clone()  # (B, T, V)
        model.train(training)
        seen["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        return keep(config, record, trainer, warn)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(final_weights, "keep_final_weights", spying)
        record = run_tiny(tmp_path, *RUN)
    return record, _record_path(tmp_path, record), seen


def test_a_finished_run_keeps_its_final_weights_and_its_record_names_them(kept):
    record, path, _ = kept
    folder = path.parent.parent / "checkpoints" / "default" / record["run_id"]
    assert record["status"] == "finished" and record["weights_path"] == str(folder / FILENAME)
    assert [p.name for p in folder.iterdir()] == [FILENAME]  # the resume points: deleted
    assert json.loads(path.read_text())["weights_path"] == record["weights_path"]
    saved = torch.load(folder / FILENAME, map_location="cpu", weights_only=True)  # plain tensors
    assert set(saved) == {"state_dict", "xbench"}
    assert all(k.startswith("model.") for k in saved["state_dict"])  # no optimiser, no loops
    assert saved["xbench"]["record"]["run_id"] == record["run_id"]


def test_the_loaded_weights_are_the_trained_models_and_give_its_logits(kept):
    record, path, seen = kept
    found, weights = locate(path)
    assert weights == Path(record["weights_path"])
    model = load_model(found, weights)
    loaded = model.state_dict()
    assert loaded.keys() == seen["state"].keys()
    assert all(torch.equal(loaded[k], seen["state"][k]) for k in loaded)
    with torch.no_grad():
        assert torch.equal(model(TOKENS), seen["logits"])


def test_xbench_sample_on_the_record_and_on_final_pt_prints_the_same_text(kept, capsys):
    record, path, _ = kept
    args = ["--prompt", "ab", "--length", "20", "--seed", "1"]
    assert main([str(path), *args]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ab") and len(out.rstrip("\n")) >= 2 + 20 // 4  # <= 4 bytes a char
    assert main([record["weights_path"], *args]) == 0
    assert capsys.readouterr().out == out


def test_a_moved_results_folder_still_finds_weights_named_relative_to_it(kept, tmp_path,
                                                                        monkeypatch, capsys):
    record, path, _ = kept
    moved = tmp_path / "elsewhere" / "results"
    relative = Path("results") / "checkpoints" / "default" / record["run_id"] / FILENAME
    (moved / relative.relative_to("results")).parent.mkdir(parents=True)
    shutil.copy(record["weights_path"], moved / relative.relative_to("results"))
    copy = json.loads(path.read_text())
    copy["config"]["paths"]["results_dir"] = "results"
    copy["weights_path"] = str(relative)
    (moved / "default").mkdir()
    (moved / "default" / path.name).write_text(json.dumps(copy))
    monkeypatch.chdir(tmp_path)  # no results/ here: found beside the record
    assert main([str(moved / "default" / path.name), "--length", "4"]) == 0
    assert capsys.readouterr().out.startswith("The ")


def test_the_off_switch_writes_nothing_keeps_the_id_and_its_command_keeps_them(kept, tmp_path,
                                                                               capsys):
    record, _, _ = kept
    off = run_tiny(tmp_path, *RUN, "trainer.keep_weights=false")
    assert off["status"] == "finished" and off["weights_path"] is None
    assert off["run_id"] == record["run_id"]  # the key is outside the run id
    left = [p for p in (tmp_path / "results" / "checkpoints").rglob("*") if p.is_file()]
    assert left == []  # no weights written; the resume points deleted as before

    assert main([str(_record_path(tmp_path, off))]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: run {off['run_id']} kept no weights (its record names no "
                           "weights_path); re-run it keeping them (same run id): xbench ")
    assert line.endswith(" trainer.keep_weights=true skip_completed=false")

    # the command it names, as `xbench` runs it: not skipped, the same id, the weights kept
    from xformer_bench.job import run_job

    overrides = shlex.split(line.split("(same run id): ", 1)[1])[1:]
    assert overrides.count("trainer.keep_weights=true") == 1  # false dropped, true added
    config = compose_config(*overrides)
    assert run_identity(resolve_precision(config), _choices(config)) == off["run_id"]
    assert config["skip_completed"] is False and config["trainer"]["keep_weights"] is True
    run_job(config, _choices(config), overrides, tmp_path / "again", multirun=False)
    again = json.loads(_record_path(tmp_path, off).read_text())
    assert again["run_id"] == off["run_id"] and Path(again["weights_path"]).is_file()
    assert main([str(_record_path(tmp_path, off)), "--length", "4"]) == 0


def test_an_older_record_without_the_key_or_with_its_file_gone_is_one_error_line(
        kept, tmp_path, capsys):
    record, path, _ = kept
    old = {k: v for k, v in json.loads(path.read_text()).items() if k != "weights_path"}
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert main([str(tmp_path / "old.json")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "kept no weights (its record names no weights_path)" in line
    assert "trainer.keep_weights=true skip_completed=false" in line
    gone = old | {"weights_path": str(tmp_path / "nowhere" / FILENAME)}
    (tmp_path / "gone.json").write_text(json.dumps(gone))
    assert main([str(tmp_path / "gone.json")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert f"kept no weights ({tmp_path / 'nowhere' / FILENAME} is missing)" in line


def test_a_run_that_did_not_finish_says_so_not_how_to_keep_its_weights(kept, tmp_path, capsys):
    """A diverged run's record once got "re-run it keeping them": it would diverge again."""
    record, path, _ = kept
    diverged = {k: v for k, v in json.loads(path.read_text()).items() if k != "weights_path"}
    diverged |= {"status": "diverged", "error": "training loss is nan at step 1\nmore"}
    (tmp_path / "diverged.json").write_text(json.dumps(diverged))
    assert main([str(tmp_path / "diverged.json")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: run {record['run_id']} did not finish (status diverged: training "
                    "loss is nan at step 1): it has no final weights to sample")


def test_a_final_pt_that_is_not_one_is_one_error_line(tmp_path, capsys):
    torch.save({"state_dict": {}}, tmp_path / "final.pt")
    assert main([str(tmp_path / "final.pt")]) == 2
    assert "no xbench run's final weights" in capsys.readouterr().err
    (tmp_path / "cut.pt").write_bytes(b"cut short")
    assert main([str(tmp_path / "cut.pt")]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: weights {tmp_path / 'cut.pt'} do not load")


def test_auto_keeps_language_models_up_to_the_limit():
    assert wanted("auto", AUTO_MAX_PARAMS, "lm") and not wanted("auto", AUTO_MAX_PARAMS + 1, "lm")
    assert not wanted("auto", 1000, "classify") and not wanted("auto", None, "lm")
    assert wanted(True, 10 ** 12, "classify") and not wanted(False, 1000, "lm")


def test_the_key_is_checked_and_outside_the_run_id():
    ids = set()
    for value in ("auto", "true", "false"):
        config = resolve_precision(compose_config(*TINY_RUN, f"trainer.keep_weights={value}"))
        check_config(config)
        ids.add(run_identity(config, _choices(config)))
    assert len(ids) == 1
    with pytest.raises(ConfigError, match=r"^trainer.keep_weights=maybe is not one of its "
                                          r"choices; choose one of: auto, true, false"):
        check_config(compose_config("trainer.keep_weights=maybe"))
