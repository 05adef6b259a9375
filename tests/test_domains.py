"""Every task trains through the real run path on generated data whose answer is known, and
its metric moves the right way: pixel LM bits/dim falls, image classes are told apart, the
copy task's bits/token falls, ListOps trains; and inapplicable combinations are one line."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import compose_config
from test_data_cifar10 import _official_members, _write_tarball
from test_data_imagenet import _image_folder
from xformer_bench.config import choice_groups
from xformer_bench.errors import ConfigError
from xformer_bench.run import execute

TINY = ("model.d_model=32", "model.n_layers=1", "model.n_heads=2", "model.d_ff=64",
        "optim.warmup_steps=2", "trainer.progress_bar=false", "logger=none")


def run_domain(tmp_path, *overrides: str) -> dict:
    overrides = (*TINY, f"paths.data_dir={tmp_path / 'data'}",
                 f"paths.results_dir={tmp_path / 'results'}", *overrides)
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    return execute(config, choices, list(overrides), tmp_path / "run")


def _bits(record: dict, when: str) -> float:
    return record[when][f"val/{record['primary_metric']}"]


def test_pixel_lm_bits_per_dim_fall_on_cifar_images(tmp_path):
    _write_tarball(tmp_path / "data" / "cifar10", _official_members())
    record = run_domain(tmp_path, "data=cifar10", "data.resolution=8", "data.seq_len=192",
                        "data.val_size=4", "data.batch_size=4", "model=image_transformer",
                        "attention.block=32", "attention.memory=32", "trainer.max_steps=40")
    assert record["primary_metric"] == "bits_per_dim" and record["eval_counts"]["test"] == 4 * 192
    assert _bits(record, "final") < _bits(record, "early") < 8.1


def test_a_vit_tells_coloured_image_classes_apart(tmp_path):
    folder = _image_folder(tmp_path / "folder", n_train=8, n_val=3)
    record = run_domain(tmp_path, "data=imagenet", f"data.path={folder}", "data.resolution=16",
                        "data.val_fraction=0.25", "data.batch_size=8", "model=vit",
                        "trainer.max_steps=30")
    assert record["task"] == "classify" and record["eval_counts"]["test"] == 9
    assert record["test"]["test/top1"] > 0.9  # chance: 1/3


def test_copy_bits_per_token_fall(tmp_path):
    record = run_domain(tmp_path, "data=copy", "data.length=8", "data.seq_len=16",
                        "data.n_symbols=6", "data.n_val=32", "data.n_test=32", "data.batch_size=16",
                        "trainer.max_steps=150", "position=learned", "model.n_layers=2")
    assert record["primary_metric"] == "bits_per_token"
    assert _bits(record, "final") < 0.8 * _bits(record, "early")


def test_listops_trains_an_encoder_over_padded_expressions(tmp_path):
    record = run_domain(tmp_path, "data=listops", "data.max_length=64", "data.min_length=16",
                        "data.n_train=200", "data.n_val=40", "data.n_test=40",
                        "data.batch_size=16", "model.pool=mean", "trainer.max_steps=20")
    assert record["status"] == "finished" and record["eval_counts"]["test"] == 40
    assert 0.0 <= record["test"]["test/top1"] <= 1.0 and record["test"]["test/top5"] >= \
        record["test"]["test/top1"]


@pytest.mark.parametrize("overrides,words", [
    (("data=listops", "attention=retnet"), "an encoder over padded inputs needs bidirectional"),
    (("data=listops", "stack=recurrent"), "independent examples"),
    (("data=copy", "data.length=8", "data.seq_len=16", "attention=linformer"), "needs causal"),
])
def test_inapplicable_combinations_are_one_line_errors(tmp_path, overrides, words):
    with pytest.raises(ConfigError, match=words) as error:
        run_domain(tmp_path, "data.n_train=50" if "data=listops" in overrides else "seed=0",
                   *overrides, *(("data.max_length=64", "data.min_length=16", "data.n_val=8",
                                  "data.n_test=8") if "data=listops" in overrides else ()))
    assert "\n" not in str(error.value)


def test_a_pixel_lm_draws_a_grid_of_images(tmp_path):
    from PIL import Image

    from xformer_bench.sample import main as sample

    _write_tarball(tmp_path / "data" / "cifar10", _official_members())
    record = run_domain(tmp_path, "data=cifar10", "data.resolution=4", "data.seq_len=48",
                        "data.val_size=4", "data.batch_size=4", "trainer.max_steps=4",
                        "trainer.checkpoint=true")
    assert record["layout"] == [4, 4, 3]
    out = tmp_path / "grid.png"
    assert sample([record["record_path"], "--grid", "2", "--out", str(out), "--seed", "1"]) == 0
    image = np.asarray(Image.open(out))
    assert image.shape == (9, 9, 3)  # 2 x 2 images of 4 x 4 and a one-pixel gap
    assert (image[4, :] == 255).all() and image[:4, :4].std() > 0  # gap white, samples vary


def test_translation_through_the_run_path_raises_bleu_and_records_the_signature(tmp_path):
    from test_data_wmt14 import _write_folder

    _write_folder(tmp_path / "corpus", sizes=(("train", 400), ("valid", 12), ("test", 16)))
    record = run_domain(tmp_path, "data=wmt14", f"data.path={tmp_path / 'corpus'}",
                        "data.vocab_size=400", "data.subset=null", "data.seq_len=64",
                        "data.max_source_len=40", "data.max_target_len=40",
                        "data.batch_size=16", "model=transformer_base", "model.dropout=0.0",
                        "model.n_layers=2", "eval.beam=2", "trainer.max_steps=300", "model.d_model=64",
                        # the house schedule: Vaswani's 4000 warm-up steps outlast this run
                        "optim.lr=3e-3", "optim.decay=cosine", "optim.warmup_steps=50")
    assert record["task"] == "translate" and record["primary_metric"] == "bleu"
    assert record["bleu_signature"].startswith("nrefs:1") and record["decoding"]["test"] == "beam 2"
    assert "val/bleu" not in record["early"]  # eval.val_bleu: last -- the loss alone before
    assert record["final"]["val/loss"] < record["early"]["val/loss"]
    assert record["final"]["val/bleu"] > 40 and record["test"]["test/bleu"] > 40  # val 80.8, test 87.4
