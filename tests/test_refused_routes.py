"""Routes the README documents that xbench used to refuse, each planned and
trained on small generated data in the real formats:

* ``experiment=narang_table1 data=wmt14``: the encoder-decoder's rows, the task read from the
  dataset's declaration and a window the translation task accepts;
* ``model=sparse_transformer`` on ``cifar10_classify`` and ``imagenet``: strided attention,
  bidirectional, in the encoder;
* Child et al.'s ImageNet 64x64 row: density modelling (``data.mode=pixel_lm``);
* ``-m attention=strided,fixed attention.stride=64``: a key of a swept group, set in each job;
  a key one option lacks is one line naming that option.
"""

from __future__ import annotations

import json
import math
import typing

import pytest

from conftest import choice_groups, compose_config, xbench
from test_data_cifar10 import _official_members, _write_tarball
from test_data_imagenet import _image_folder
from test_domains import run_domain
from xformer_bench.cli import run_job
from xformer_bench.option_settings import apply_option_settings
from xformer_bench.paper_rows import one_job, refusal, with_row
from xformer_bench.preflight import command_line_error
from xformer_bench.references import load
from xformer_bench.registry import DATA
from xformer_bench.results.paper_columns import Comparison, paper_row
from xformer_bench.schema.data import task_of
from xformer_bench.swept_group_keys import held_for_jobs

ENCODER_DECODER_ROWS = {"Encoder only block sharing": "modification=sharing_encoder",
                        "Decoder only block sharing": "modification=sharing_decoder",
                        "Transparent attention": "modification=transparent_attention"}
TINY_MODEL = ("model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64",
              "optim.warmup_steps=1", "trainer.progress_bar=false", "logger=none")


# --- (a) Narang Table 1 on WMT'14 ---------------------------------------------------------------

def test_each_dataset_declares_the_task_its_datamodule_trains(tmp_path):
    """The declaration (schema/data.py, read without building) against the class each builder
    returns; imagenet's task follows data.mode, so both modes are built on a tiny folder."""
    for name in DATA.names():
        declared = task_of(compose_config(f"data={name}")["data"])
        if name == "imagenet":
            continue
        assert declared == typing.get_type_hints(DATA.get(name))["return"].task, name
    assert task_of(compose_config("data=wmt14")["data"]) == "translate"
    folder = _image_folder(tmp_path / "folder", n_train=4, n_val=2)
    for mode, keys in (("classify", {}), ("pixel_lm", {"resolution": 8, "seq_len": 192})):
        node = {**compose_config("data=imagenet", f"data.mode={mode}")["data"], **keys,
                "path": str(folder), "val_fraction": 0.25}
        built = DATA.build(node, seed=0, data_dir=str(tmp_path / "data"))
        assert task_of(node) == built.task == {"classify": "classify", "pixel_lm": "lm"}[mode]


@pytest.mark.parametrize("label", sorted(ENCODER_DECODER_ROWS))
def test_the_encoder_decoder_rows_are_run_on_wmt14_and_refused_on_bytes(label):
    row = load("narang2021_table1").row(label)
    assert row.overrides == (ENCODER_DECODER_ROWS[label],)
    on_bytes = refusal(with_row(["experiment=narang_table1"], row.overrides))
    assert on_bytes is not None and "needs an encoder and a decoder" in on_bytes
    assert refusal(with_row(["experiment=narang_table1", "data=wmt14"], row.overrides)) is None


def test_the_study_gives_wmt14_a_window_its_sentences_fit():
    """narang_base's 128 positions are the byte LM's; on wmt14 the study sets the dataset's own
    256 (its 128-token sentences plus bos / eos need 129); the command line still wins."""
    argv = ["experiment=narang_table1", "data=wmt14"]
    data = apply_option_settings(compose_config(*argv), argv)["data"]
    assert data["seq_len"] == 256 > max(data["max_source_len"], data["max_target_len"]) + 1
    assert apply_option_settings(compose_config("experiment=narang_table1"),
                                 ["experiment=narang_table1"])["data"]["seq_len"] == 128
    mine = [*argv, "data.seq_len=200"]
    assert apply_option_settings(compose_config(*mine), mine)["data"]["seq_len"] == 200


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from test_data_wmt14 import _write_folder

    folder = tmp_path_factory.mktemp("corpus")
    _write_folder(folder, sizes=(("train", 60), ("valid", 4), ("test", 4)))
    return folder


@pytest.mark.parametrize("label", ["Transparent attention", pytest.param(
    "Encoder only block sharing", marks=pytest.mark.slow), pytest.param(
    "Decoder only block sharing", marks=pytest.mark.slow)])
def test_each_encoder_decoder_row_trains_through_the_study_on_wmt14(tmp_path, corpus, label):
    """The row's job as the study plans it (its window from the study, not the command line),
    through the CLI's job path, two steps."""
    common = ["experiment=narang_table1", "data=wmt14", f"data.path={corpus}",
              "data.vocab_size=120", "data.subset=null", "data.batch_size=8",
              "data.eval_batch_size=4", "eval.beam=2", "eval.max_extra_len=4", *TINY_MODEL,
              "trainer.max_steps=2", f"paths.data_dir={tmp_path / 'data'}",
              f"paths.results_dir={tmp_path / 'results'}"]
    argv = one_job(with_row(common, load("narang2021_table1").row(label).overrides))
    config = compose_config(*argv)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    run_job(config, choices, argv, tmp_path / "run", multirun=True)
    [path] = (tmp_path / "results" / "narang_table1").glob("*.json")
    record = json.loads(path.read_text())
    assert record["status"] == "finished" and record["task"] == "translate"
    assert record["config"]["data"]["seq_len"] == 256
    assert math.isfinite(record["final"]["val/loss"])


# --- (b) the Sparse Transformer's strided attention in an encoder --------------------------------

@pytest.mark.parametrize("data", ["cifar10_classify", "imagenet"])
def test_the_preset_is_accepted_with_strided_attention_on_classification(data):
    assert command_line_error(["model=sparse_transformer", f"data={data}"]) is None
    assert compose_config("model=sparse_transformer", f"data={data}")["attention"]["name"] == \
        "strided"


def test_the_preset_classifies_imagenet_through_bidirectional_strided_attention(tmp_path):
    """17 tokens ([CLS] and 16 patches) in rows of 4: sparse, and attended both ways."""
    folder = _image_folder(tmp_path / "folder", n_train=4, n_val=2)
    record = run_domain(tmp_path, "model=sparse_transformer", "data=imagenet",
                        f"data.path={folder}", "data.resolution=16", "data.val_fraction=0.25",
                        "data.batch_size=4", "attention.stride=4", "trainer.max_steps=2")
    assert record["status"] == "finished" and record["task"] == "classify"
    assert record["config"]["attention"]["name"] == "strided"
    coverage = record["attention_coverage"]
    assert coverage["causal"] is False and coverage["attended_fraction"] < 1


@pytest.mark.slow
def test_the_preset_classifies_cifar10_luma_tokens(tmp_path):
    _write_tarball(tmp_path / "data" / "cifar10", _official_members())
    record = run_domain(tmp_path, "model=sparse_transformer", "data=cifar10_classify",
                        "data.val_size=4", "data.batch_size=4", "data.eval_batch_size=4",
                        "trainer.max_steps=2")
    assert record["status"] == "finished" and record["task"] == "classify"
    assert record["config"]["attention"]["name"] == "strided"


# --- (c) Child et al. Table 1, ImageNet 64x64 -------------------------------------------------

def test_the_imagenet_64_row_is_density_modelling_in_bits_per_dim():
    table = load("sparse_transformer2019_table1")
    row = next(r for r in table.keyed() if r.cells["dataset"] == "ImageNet 64x64")
    config = compose_config(*row.overrides)
    data = config["data"]
    assert (data["name"], data["mode"], data["resolution"]) == ("imagenet", "pixel_lm", 64)
    assert data["seq_len"] == 64 * 64 * 3 and task_of(data) == "lm"
    assert command_line_error(list(row.overrides)) is None

    def run(*overrides):
        composed = compose_config(*overrides)
        return {"config": composed, "choices": {g: composed[g]["name"] for g in choice_groups()
                                                if "name" in composed.get(g, {})}}

    comparison = Comparison(table)
    assert paper_row([run(*row.overrides)], comparison) == row
    classify = run("model=sparse_transformer", "attention=strided", "data=imagenet")
    assert paper_row([classify], comparison) is None


def test_the_imagenet_row_trains_as_a_pixel_lm(tmp_path):
    folder = _image_folder(tmp_path / "folder", n_train=4, n_val=2)
    record = run_domain(tmp_path, "model=sparse_transformer", "attention=strided",
                        "data=imagenet", "data.mode=pixel_lm", f"data.path={folder}",
                        "data.resolution=8", "data.seq_len=192", "data.val_fraction=0.25",
                        "data.batch_size=4", "attention.stride=24", "trainer.max_steps=2")
    assert record["status"] == "finished" and record["primary_metric"] == "bits_per_dim"
    assert record["eval_counts"]["test"] % 192 == 0


# --- (d) a key of a swept group -------------------------------------------------------------------

def test_a_key_of_a_swept_group_waits_for_each_jobs_option():
    argv = ["-m", "attention=strided,fixed", "attention.stride=64", "+attention.x=1",
            "model.d_model=32,64", "model.d_ff=64", "seed=1"]
    assert held_for_jobs(argv) == ["-m", "attention=strided,fixed", "attention.stride=choice(64)",
                                   "+attention.x=1", "model.d_model=32,64", "model.d_ff=64",
                                   "seed=1"]
    single = ["attention=strided", "attention.stride=64"]  # no sweep: Hydra applies it in order
    assert held_for_jobs(single) == single
    assert held_for_jobs(["-m", "attention=strided", "attention.stride=64"]) == \
        ["-m", "attention=strided", "attention.stride=64"]


@pytest.mark.parametrize("sweep", ["attention=strided,fixed", "attention=fixed,strided"])
def test_a_key_one_swept_option_lacks_is_one_line_naming_it(sweep):
    error = command_line_error(["-m", sweep, "attention.summary=8"])
    assert error is not None and "\n" not in str(error)
    assert str(error).startswith("attention.summary is not a key of attention=strided, which "
                                 f"{sweep} runs (its keys: stride, mode)")


@pytest.mark.slow  # a whole sweep in a subprocess: make test-full
def test_a_sweep_over_two_options_with_a_key_both_have_runs_each(tmp_path):
    result = xbench("-m", "attention=strided,fixed", "attention.stride=64", "data.size=20000",
                    "data.seq_len=64", "data.batch_size=4", "data.eval_batch_size=16",
                    *TINY_MODEL, "trainer.max_steps=2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    records = [json.loads(p.read_text()) for p in (tmp_path / "results").rglob("*.json")]
    ran = {r["config"]["attention"]["name"]: r for r in records}
    assert sorted(ran) == ["fixed", "strided"]
    for record in ran.values():
        assert record["status"] == "finished" and record["config"]["attention"]["stride"] == 64
        assert "attention.stride=64" in record["overrides"]
