"""A catalogue of bad inputs: each reaches the user as exactly one ``error:`` line
that names its fix, a non-zero exit status, no traceback (unless ``XBENCH_DEBUG=1``) and no
run record for the tables to count.

Most cases run ``xbench`` in-process (``cli.main()`` on a patched ``sys.argv``; a subprocess
costs seconds of imports each); a few run it as a user does, end to end.  Every case that gets
as far as building a model asks for a tiny one, and every data case stops before training.
"""

from __future__ import annotations

import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra

from conftest import xbench
from test_data_imagenet import _image_folder
from xformer_bench import cli
from xformer_bench.results.collect import collect

TINY = ("model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64",
        "data.seq_len=32", "data.batch_size=4", "trainer.max_steps=2", "logger=none",
        "trainer.progress_bar=false", "paths.results_dir={tmp}/results",
        "paths.data_dir={tmp}/data")
LISTOPS = ("data=listops", "data.max_length=32", "data.min_length=8", "data.n_train=32",
           "data.n_val=4", "data.n_test=4")
"""ListOps small enough to generate in a blink, padded to the tiny data.seq_len=32."""
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here")


def _write(relative: str, payload: bytes) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        path = tmp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(payload)
    return make


def _zip(relative: str, members: dict[str, bytes]) -> Callable[[Path], None]:
    def make(tmp: Path) -> None:
        path = tmp / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path, "w") as archive:
            for name, payload in members.items():
                archive.writestr(name, payload)
    return make


def _one_class_folder(tmp: Path) -> None:
    _image_folder(tmp / "folder", classes={"red": (240, 20, 30)}, n_train=2, n_val=1)


@dataclass(frozen=True)
class BadInput:
    overrides: tuple[str, ...]  # after TINY; "{tmp}" is the test's folder
    fix: str                    # words of the error line that name the fix
    make: Callable[[Path], None] | None = None  # the files the case needs
    marks: tuple = ()


CATALOGUE: dict[str, BadInput] = {
    # -- the command line (xformer_bench.preflight) ------------------------------------------
    "unknown option": BadInput(("attention=flashy",), "choose one of: adaptive_span, axial"),
    "misspelt option": BadInput(("attention=perfromer",), "did you mean attention=performer?"),
    "misspelt key": BadInput(("model.d_modle=64",), "did you mean model.d_model=64?"),
    "misspelt group": BadInput(("atention=full",), "did you mean attention=full?"),
    "key of another option": BadInput(("data=cifar10_classify", "data.resolution=8"),
                                      "not a key of data=cifar10_classify; choose one of: "),
    "override without =": BadInput(("model.d_model",), "write KEY=VALUE"),
    "unclosed list": BadInput(("model.d_model=[1,",), "write KEY=VALUE (a list as KEY=[a,b]"),
    "unknown experiment": BadInput(("experiment=narang_foo",),
                                   "choose one of: ablate, attention_zoo, attention_zoo_long"),
    "several values without -m": BadInput(("seed=0,1",), "add -m (--multirun)"),
    "unknown option in a sweep": BadInput(("-m", "attention=full,flashy"),
                                          "attention=flashy is not an option"),
    "unresolvable interpolation": BadInput(("data.seq_len=${nope}",),
                                           "point its ${...} at an existing key"),
    # -- the machine (xformer_bench.hardware) -------------------------------------------------
    "gpu without a gpu": BadInput(("trainer.accelerator=gpu",), "use trainer.accelerator=cpu",
                                  marks=(NO_GPU,)),
    "cuda without a gpu": BadInput(("trainer.accelerator=cuda",), "no GPU is visible",
                                   marks=(NO_GPU,)),
    "unknown precision": BadInput(("trainer.precision=fp8",), "choose one of: auto, 32-true"),
    "fsdp on cpus": BadInput(("trainer=fsdp", "trainer.accelerator=cpu"),
                             "runs on GPUs only and none is used here: use trainer=ddp"),
    # -- the model -------------------------------------------------------------------------------
    "heads not dividing d_model": BadInput(("model.n_heads=3",),
                                           "choose model.n_heads among 1, 2, 4, 8, 16, 32"),
    "zero d_model": BadInput(("model.d_model=0",), "model.d_model=0 must be a positive integer"),
    "negative n_layers": BadInput(("model.n_layers=-1",), "must be a positive integer"),
    "zero n_layers": BadInput(("model.n_layers=0",), "must be a positive integer"),
    "seq_len beyond a learned table": BadInput(
        ("position=learned", "position.max_len=16"), "set position.max_len=32"),
    "bidirectional attention in an LM": BadInput(("attention=linformer",),
                                                 "choose another model or attention"),
    "memory across independent examples": BadInput(("stack=recurrent", *LISTOPS),
                                                   "choose another stack"),
    "running statistics in shared blocks": BadInput(("norm=powernorm", "model=shared_blocks"),
                                                    "choose another norm or model"),
    "irreversible blocks": BadInput(("stack=reversible", "model.norm_placement=post"),
                                    "choose another stack or model"),
    "residual attention without logits": BadInput(
        ("model.residual_attention=true", "attention=performer"),
        "choose another model or attention"),
    "unknown norm placement": BadInput(("model.norm_placement=middle",),
                                       "choose one of: pre, post, sandwich"),
    "unknown pool": BadInput(("model.pool=max", *LISTOPS), "choose one of: cls, mean"),
    # -- the data ----------------------------------------------------------------------------------
    "empty text file": BadInput(("data=text", "data.path={tmp}/empty.txt"),
                                "is empty; point data.path at a text file of at least 40 bytes",
                                _write("empty.txt", b"")),
    "text file shorter than a window": BadInput(
        ("data=text", "data.path={tmp}/short.txt"), "at least 40 bytes",
        _write("short.txt", b"hi\n" * 4)),
    "missing text file": BadInput(("data=text", "data.path={tmp}/nope.txt"), "no such file"),
    "a folder as the text file": BadInput(("data=text", "data.path={tmp}"),
                                          "is a folder: point it at one text file in it"),
    "a file as the datasets' folder": BadInput(
        ("data=enwik8", "paths.data_dir={tmp}/a_file"), "a_file is a file, not a folder; "
        "choose the datasets' folder with paths.data_dir=", _write("a_file", b"not a folder")),
    "empty validation split": BadInput(
        ("data=text", "data.path={tmp}/corpus.txt", "data.splits=[1.0,0,0]"),
        "must be three positive fractions", _write("corpus.txt", b"some text " * 100)),
    "zero batch size": BadInput(("data.batch_size=0",),
                                "data.batch_size=0 must be a positive integer"),
    "zero evaluation batch size": BadInput(("data.eval_batch_size=0",),
                                           "data.eval_batch_size=0 must be a positive integer"),
    "enwik8.zip that is not a zip": BadInput(
        ("data=enwik8",), "not a readable zip (BadZipFile", _write("data/enwik8.zip", b"nope")),
    "enwik8.zip without enwik8": BadInput(
        ("data=enwik8",), "holds no file named enwik8: delete it and place the original",
        _zip("data/enwik8.zip", {"readme.txt": b"hello"})),
    "truncated enwik8": BadInput(
        ("data=enwik8",), "(and the enwik8.zip it came from) and place the original",
        _zip("data/enwik8.zip", {"enwik8": b"<mediawiki>"})),
    "enwik8 missing offline": BadInput(("data=enwik8",), "place enwik8.zip"),
    "garbage CIFAR-10 batch": BadInput(
        ("data=cifar10", "data.resolution=8", "data.seq_len=192"),
        "is not a CIFAR-10 python batch",
        _write("data/cifar10/cifar-10-batches-py/data_batch_1", b"garbage")),
    "CIFAR-10 seq_len for another resolution": BadInput(
        ("data=cifar10", "data.resolution=8", "data.seq_len=100"), "set data.seq_len=192"),
    "ImageFolder with one class": BadInput(
        ("data=imagenet", "data.path={tmp}/folder", "data.resolution=8"),
        "classification needs at least 2", _one_class_folder),
    "eval.stride beyond seq_len": BadInput(("eval.stride=64",),
                                           "between 1 and data.seq_len=32"),
    "eval.tgt_len beyond seq_len": BadInput(("model=transformer_xl", "eval.tgt_len=64"),
                                            "an integer between 1 and data.seq_len=32"),
    "zero evaluation lanes": BadInput(("model=transformer_xl", "eval.lanes=0"),
                                      "eval.lanes=0 must be a positive integer"),
    "eval.warm not a boolean": BadInput(("eval.warm=maybe",),
                                        "eval.warm=maybe must be true or false"),
    "negative evaluation memory": BadInput(("model=transformer_xl", "stack.eval_mem_len=-1"),
                                           "stack.eval_mem_len=-1 must be an integer >= 0"),
    # -- the schema (xformer_bench.schema) ---------------------------------------------
    "a count of zero": BadInput(("trainer.accumulate_grad_batches=0",),
                                "trainer.accumulate_grad_batches=0 must be a positive integer"),
    "a smoothing factor above 1": BadInput(("optim.label_smoothing=1.5",),
                                           "must be a number in [0, 1)"),
    "a preset for another input": BadInput(("model=vit", "data=text"),
                                           "choose data=imagenet data.mode=classify"),
    "results under a file": BadInput(("paths.results_dir={tmp}/a_file/results",),
                                     "choose another with paths.results_dir=",
                                     _write("a_file", b"not a folder")),
    # -- the optimisation (xformer_bench.tasks.optimization) ---------------------------------
    "negative learning rate": BadInput(("optim.lr=-1",), "optim.lr=-1 must be a positive number"),
    "zero learning rate": BadInput(("optim.lr=0",), "must be a positive number"),
    "zero steps": BadInput(("trainer.max_steps=0",),
                           "trainer.max_steps=0 must be a positive integer"),
    "unknown decay": BadInput(("optim.decay=exp",), "choose one of: cosine, linear, constant"),
    "negative warm-up": BadInput(("optim.warmup_steps=-5",), "must be 0 or a positive integer"),
}


def _arguments(case: BadInput, tmp: Path) -> list[str]:
    if case.make is not None:
        case.make(tmp)
    return [arg.replace("{tmp}", str(tmp)) for arg in (*TINY, *case.overrides)]


def run_in_process(arguments: list[str], capfd) -> tuple[object, str]:
    """``xbench ARGUMENTS`` in this process: (exit status, stderr)."""
    GlobalHydra.instance().clear()
    saved, sys.argv = sys.argv, ["xbench", *arguments]
    try:
        cli.main()
        status = 0
    except SystemExit as exit:
        status = exit.code
    finally:
        sys.argv = saved
        GlobalHydra.instance().clear()
    return status, capfd.readouterr().err


def assert_one_actionable_line(status, stderr: str, fix: str, results: Path) -> None:
    assert status not in (0, None), stderr[-2000:]
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr[-2000:]
    assert fix in errors[0]
    assert "Traceback" not in stderr
    assert not list(results.rglob("*.json")), "a run record was written"
    assert not [r for r in collect(results).records if r["status"] == "finished"]


@pytest.mark.parametrize("case", [pytest.param(case, id=name, marks=case.marks)
                                  for name, case in CATALOGUE.items()])
def test_a_bad_input_is_one_actionable_error_line(case, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)  # Hydra's run folder
    monkeypatch.delenv("XBENCH_DEBUG", raising=False)
    status, stderr = run_in_process(_arguments(case, tmp_path), capfd)
    assert_one_actionable_line(status, stderr, case.fix, tmp_path / "results")


@pytest.mark.parametrize("name", ["unknown option", "heads not dividing d_model"])
def test_xbench_debug_adds_the_traceback(name, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XBENCH_DEBUG", "1")
    case = CATALOGUE[name]
    status, stderr = run_in_process(_arguments(case, tmp_path), capfd)
    assert status == 2 and "Traceback (most recent call last)" in stderr
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and case.fix in errors[0]


@pytest.mark.parametrize("name", ["misspelt key", pytest.param(
    "heads not dividing d_model", marks=pytest.mark.slow), pytest.param(
    "empty text file", marks=pytest.mark.slow)])  # each a subprocess; in-process tests cover all
def test_end_to_end_a_bad_input_exits_2_without_a_traceback(name, tmp_path):
    case = CATALOGUE[name]
    result = xbench(*_arguments(case, tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert_one_actionable_line(result.returncode, result.stderr, case.fix, tmp_path / "results")


# -- a study's row that is full attention at the study's length ---------------------
FULL_AT_ITS_LENGTH = BadInput(
    ("experiment=attention_zoo", "attention=dilated", "attention.window=64",
     "attention.dilation=1"),
    "it is full attention here; run it at a length where it is sparse, change attention.window")
"""dilated's 64 adjacent keys cover all 32 positions: sub-quadratic in name only."""


def test_a_study_row_that_is_full_attention_at_its_length_is_one_error_line(
        tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("XBENCH_DEBUG", raising=False)
    status, stderr = run_in_process(_arguments(FULL_AT_ITS_LENGTH, tmp_path), capfd)
    assert_one_actionable_line(status, stderr, FULL_AT_ITS_LENGTH.fix, tmp_path / "results")
    assert status == 2 and "declare it a control of experiment=attention_zoo" in stderr
