"""Bad inputs to sampling, resuming and the ImageFolder cache: each planted
one is refused with one ``error:`` line before any work (``xbench-sample``: exit 2, no
traceback; ``resume=``: before a training step), and a changed ImageFolder is decoded anew."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import lightning as L
import pytest
import torch

from conftest import TINY_RUN, run_tiny, xbench
from test_data_imagenet import _build, _image_folder, _png
from xformer_bench.data import image_cache
from xformer_bench.errors import ConfigError
from xformer_bench.sample import main as sample


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny byte LM that kept its checkpoint: the record's path and the checkpoint."""
    tmp_path = tmp_path_factory.mktemp("sampled")
    record = run_tiny(tmp_path, "trainer.checkpoint=true", "trainer.max_steps=2")
    return (tmp_path / "results" / "default" / f"{record['run_id']}.json",
            tmp_path / "run" / "checkpoints" / "last.ckpt")


def refused(capsys, argv: list[str], words: str) -> str:
    """``xbench-sample argv`` exits 2 with exactly one ``error:`` line containing ``words``."""
    assert sample(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and words in lines[0], captured.err
    assert "Traceback" not in captured.err and not captured.out
    return lines[0]


@pytest.mark.parametrize("args,words", [
    (["--temperature", "nan"], "argument --temperature: nan must be a number >= 0"),
    (["--temperature", "-1"], "argument --temperature: -1 must be a number >= 0"),
    (["--top-p", "0"], "argument --top-p: 0 must be a number in (0, 1]"),
    (["--top-k", "0"], "argument --top-k: 0 must be an integer >= 1"),
    (["--length", "-3"], "argument --length: -3 must be an integer >= 0"),
    (["--length", "0", "--benchmark"], "--benchmark times --length tokens"),
    (["--grid", "0"], "argument --grid: 0 must be an integer >= 1"),
    (["--seed", "x"], "argument --seed: 'x' is not an integer"),
    (["--device", "cuda:99"], "--device cuda:99: this machine has"),
    (["--device", "toaster"], "--device toaster is not a device"),
])
def test_a_bad_argument_is_one_error_line(trained, capsys, args, words):
    refused(capsys, [str(trained[0]), *args], words)


def _copy_run(tmp_path, trained, checkpoint_bytes: bytes | None = None, **record_keys):
    """A run folder holding the trained record (with ``record_keys``) and a checkpoint."""
    record = json.loads(trained[0].read_text()) | {"run_dir": str(tmp_path / "run")}
    ckpt = tmp_path / "run" / "checkpoints" / "last.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(trained[1].read_bytes() if checkpoint_bytes is None else checkpoint_bytes)
    (tmp_path / "run" / "record.json").write_text(json.dumps(record | record_keys))
    (tmp_path / "r.json").write_text(json.dumps(record | record_keys))
    return tmp_path / "r.json", ckpt


def test_a_corrupt_or_foreign_checkpoint_is_one_error_line(trained, tmp_path, capsys):
    whole = trained[1].read_bytes()
    _, cut = _copy_run(tmp_path / "cut", trained, whole[:len(whole) // 2])
    refused(capsys, [str(cut)], f"checkpoint {cut} does not load")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "plain.pt")
    record, _ = _copy_run(tmp_path / "plain", trained, (tmp_path / "plain.pt").read_bytes())
    refused(capsys, [str(record)], "holds no xbench language model")


def test_a_checkpoint_of_another_model_is_one_error_line(trained, tmp_path, capsys):
    record = json.loads(trained[0].read_text())
    record["config"]["model"]["n_layers"] = 3
    path, _ = _copy_run(tmp_path, trained, config=record["config"])
    refused(capsys, [str(path)], "does not fit the model of its run record")


def test_an_out_under_a_file_is_refused_before_the_model_loads(trained, tmp_path, capsys):
    record, _ = _copy_run(tmp_path, trained, b"cut short", eval_unit="dims", layout=[2, 2, 3])
    (tmp_path / "afile.txt").write_text("not a folder")
    out = tmp_path / "afile.txt" / "samples.png"
    refused(capsys, [str(record), "--out", str(out)], "afile.txt is a file, not a folder")
    refused(capsys, [str(record), "--out", str(tmp_path / "samples.jpg")], "name a .png file")
    refused(capsys, [str(record), "--out", str(tmp_path)], "is a folder")
    # a good --out passes, to the (planted) unreadable checkpoint: the --out check came first
    refused(capsys, [str(record), "--out", str(tmp_path / "new" / "s.png")], "does not load")


def test_the_console_script_exits_2_with_one_line(trained):
    done = subprocess.run([sys.executable, "-m", "xformer_bench.sample", str(trained[0]),
                           "--temperature", "nan"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "error: argument --temperature: nan must be a number >= 0 (0: greedy) "
        "(xbench-sample --help lists the arguments)"]


# -- resume= a file that is no xbench checkpoint ------------------------------------------


@pytest.fixture
def fits(monkeypatch) -> list:
    """The calls of ``Trainer.fit``: empty when a run was refused before training."""
    calls = []
    original = L.Trainer.fit
    monkeypatch.setattr(L.Trainer, "fit", lambda self, *a, **k: (calls.append(1),
                                                                 original(self, *a, **k))[1])
    return calls


def _lightning_without_identity(path):
    torch.save({"pytorch-lightning_version": L.__version__, "state_dict": {}}, path)


@pytest.mark.parametrize("write,words", [
    (lambda p: p.write_text("hello, not a checkpoint\n"), "not a checkpoint torch can load"),
    (lambda p: torch.save({"model": torch.zeros(2)}, p),
     "is not a Lightning checkpoint (no pytorch-lightning_version"),
    (lambda p: torch.save([1, 2], p), "is not a Lightning checkpoint"),
    (_lightning_without_identity, "no xbench run's (it carries no xbench identity)"),
])
def test_resume_to_a_file_that_is_no_xbench_checkpoint_is_refused_before_training(
        tmp_path, fits, write, words):
    planted = tmp_path / "planted.ckpt"
    write(planted)
    with pytest.raises(ConfigError) as error:
        run_tiny(tmp_path, f"resume={planted}")
    message = str(error.value)
    assert message.startswith(f"resume={planted}") and words in message and "\n" not in message
    assert fits == []  # nothing trained
    records = list((tmp_path / "results").rglob("*.json"))
    assert all(json.loads(r.read_text())["status"] != "finished" for r in records)


def test_xbench_resume_to_a_text_file_is_one_error_line(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    done = xbench(*TINY_RUN, "paths.results_dir=results", "resume=notes.txt", cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert lines[-1].startswith("error: resume=notes.txt: not a checkpoint torch can load")
    records = list((tmp_path / "results").rglob("*.json"))
    assert all(json.loads(r.read_text())["status"] != "finished" for r in records)


# -- the ImageFolder cache follows the folder's content ---------------------------------------


def test_an_image_folder_that_gains_a_class_and_images_is_decoded_anew(tmp_path, monkeypatch):
    folder, data_dir = _image_folder(tmp_path / "folder"), tmp_path / "data"
    before = _build(data_dir, path=str(folder))
    assert before.num_classes == 3 and len(before.splits["test"]) == 6  # 3 classes x 2
    decoded = []
    original = image_cache.square_pixels
    monkeypatch.setattr(image_cache, "square_pixels",
                        lambda *a, **k: (decoded.append(1), original(*a, **k))[1])
    again = _build(data_dir, path=str(folder))  # unchanged: the cache, nothing decoded
    assert decoded == [] and again.data_fingerprint == before.data_fingerprint
    for split, n in (("train", 5), ("val", 3)):  # a new class, and one more red test image
        (folder / split / "yellow").mkdir()
        for i in range(n):
            (folder / split / "yellow" / f"y{i}.png").write_bytes(_png((230, 220, 20), (20, 20), i))
    (folder / "val" / "red" / "extra.png").write_bytes(_png((240, 20, 30), (20, 20), 9))
    after = _build(data_dir, path=str(folder))
    assert after.num_classes == 4 and len(after.splits["test"]) == 6 + 3 + 1
    assert after.data_fingerprint != before.data_fingerprint and decoded
    [cache] = list((data_dir / "imagenet" / "folders").iterdir())  # the old one deleted
    assert cache.name.endswith(after.data_fingerprint)
    (folder / "val" / "red" / "extra.png").write_bytes(_png((240, 20, 30), (22, 20), 9))
    edited = _build(data_dir, path=str(folder))  # an image replaced: its size differs
    assert edited.data_fingerprint not in (before.data_fingerprint, after.data_fingerprint)
    shutil.rmtree(folder)  # gone: its last cache still serves, under its fingerprint
    gone = _build(data_dir, path=str(folder))
    assert len(gone.splits["test"]) == 10 and gone.data_fingerprint == edited.data_fingerprint


def test_a_finished_run_whose_folder_changed_is_not_skipped_as_finished(tmp_path):
    from xformer_bench.job import _folder_changed

    folder = _image_folder(tmp_path / "folder")
    done = {"data_fingerprint": _build(tmp_path / "data", path=str(folder)).data_fingerprint}
    config = {"data": {"path": str(folder)}}
    assert not _folder_changed(config, done)  # the record's fingerprint is the folder's now
    (folder / "val" / "red" / "extra.png").write_bytes(_png((240, 20, 30), (20, 20), 9))
    assert _folder_changed(config, done)  # skip_completed runs it again
    assert not _folder_changed({"data": {"path": None}}, done)
