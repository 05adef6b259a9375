"""``experiment=narang_transfer``: Narang rows as ``modification=`` bundles across the four
domains (byte LM, pixel LM, image classification, translation) on generated data in the real
formats, and ``make table`` puts the domains side by side as columns with each task's metric."""

from __future__ import annotations

import zipfile

import pytest

from conftest import compose_config
from test_data import _fake_enwik8
from test_data_cifar10 import _official_members, _write_tarball
from test_data_imagenet import _image_folder
from test_data_wmt14 import _write_folder
from test_domains import run_domain
from xformer_bench.results.record import run_identity
from xformer_bench.results.report import make_tables

MODIFICATIONS = {"none": {}, "swiglu": {"activation": "swiglu"}, "rmsnorm": {"norm": "rmsnorm"},
                 "switch": {"ffn": "switch"}, "rotary": {"position": "rotary"}}


@pytest.mark.parametrize("name", MODIFICATIONS)
def test_a_modification_is_its_groups_choices_on_any_preset(name):
    for model in ("vanilla", "transformer_base"):
        bundled = compose_config(f"model={model}", f"modification={name}")
        plain = compose_config(f"model={model}",
                               *(f"{g}={o}" for g, o in MODIFICATIONS[name].items()))
        assert bundled.pop("modification")["name"] == name
        assert bundled == plain  # the bundle changes nothing else, whichever preset


def test_sharing_shares_the_blocks_of_the_preset_it_is_given():
    config = compose_config("model=transformer_base", "modification=sharing")
    assert config["model"]["share_blocks"] and config["model"]["name"] == "transformer_base"


def test_the_command_line_still_wins_over_a_modification():
    assert compose_config("modification=rotary", "position=alibi")["position"]["name"] == "alibi"


def test_a_run_without_a_modification_keeps_its_identity():
    """The group defaults to nothing, so records from before it keep their run ids."""
    config = compose_config()
    assert "modification" not in config
    assert run_identity(config, {}) == run_identity(compose_config("seed=0"), {})


DOMAINS = {
    "enwik8": ("data.seq_len=32", "data.batch_size=4"),
    "cifar10": ("data.resolution=4", "data.seq_len=48", "data.val_size=4", "data.batch_size=4"),
    "imagenet": ("data.resolution=16", "data.val_fraction=0.25", "data.batch_size=8"),
    "wmt14": ("data.vocab_size=300", "data.subset=null", "data.seq_len=48",
              "data.max_source_len=30", "data.max_target_len=30", "data.batch_size=8",
              "eval.beam=2"),
}


@pytest.mark.slow
def test_narang_transfer_puts_the_domains_side_by_side(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    with zipfile.ZipFile(data / "enwik8.zip", "w") as z:
        z.writestr("enwik8", _fake_enwik8())
    _write_tarball(data / "cifar10", _official_members())
    folder = _image_folder(tmp_path / "folder", n_train=8, n_val=3)
    _write_folder(tmp_path / "corpus", sizes=(("train", 120), ("valid", 6), ("test", 6)))
    where = {"imagenet": f"data.path={folder}", "wmt14": f"data.path={tmp_path / 'corpus'}"}
    for domain, sizes in DOMAINS.items():
        for modification in ("none", "swiglu"):
            record = run_domain(tmp_path, "experiment=narang_transfer", f"data={domain}",
                                f"modification={modification}", "trainer.max_steps=3",
                                *sizes, *([where[domain]] if domain in where else []))
            assert record["status"] == "finished", record["error"]

    make_tables(tmp_path / "results", tmp_path / "tables", ["narang_transfer"], plots=False,
                log=lambda line: None)
    lines = (tmp_path / "tables" / "narang_transfer.md").read_text().splitlines()
    header = next(line for line in lines if line.startswith("|"))
    for column in ("enwik8 bpb", "cifar10 bits/dim", "imagenet top-1", "wmt14 BLEU"):
        assert column in header
    for unit in ("bpb", "bits/dim", "top-1", "BLEU"):
        assert unit in "\n".join(lines)
    assert header.index("enwik8 bpb") < header.index("cifar10") < header.index("imagenet") \
        < header.index("wmt14")  # the sweep's order: the byte LM (pre-training) first
    rows = [line.split("|")[1].strip() for line in lines if line.startswith("| ")][2:]
    assert rows == ["Baseline", "SwiGLU"]  # per-domain sizes and paths are not rows
    assert "Seeds: finished/total runs on enwik8" in lines[-1]
