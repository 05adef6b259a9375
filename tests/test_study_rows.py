"""A study's settings per row (``conf/study_rows/<study>/<attention>.yaml``): each belongs to a
declared study and one of its swept options; attention_zoo_long runs every option at the
setting that is sub-quadratic, as its premise says."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from conftest import compose_config
from xformer_bench.config import CONF_DIR
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer

ROWS = CONF_DIR / "study_rows"


def swept(study: str, group: str = "attention") -> list[str]:
    declared = OmegaConf.load(CONF_DIR / "experiment" / f"{study}.yaml")
    return str(declared.sweep[group]).split(",")


@pytest.mark.parametrize("study", sorted(p.name for p in ROWS.iterdir() if p.is_dir()))
def test_every_row_setting_belongs_to_a_study_and_one_of_its_rows(study):
    assert (CONF_DIR / "experiment" / f"{study}.yaml").exists(), f"no experiment={study}"
    for path in (ROWS / study).glob("*.yaml"):
        assert path.stem in swept(study), f"{path} sets a row experiment={study} never runs"
        assert path.read_text().startswith("# @package _global_\n")


@pytest.mark.parametrize("option", [o for o in swept("attention_zoo_long") if o != "full"])
def test_attention_zoo_long_runs_each_option_at_a_sub_quadratic_setting(option):
    config = compose_config("experiment=attention_zoo_long", f"attention={option}")
    dims = ModelDims(d_model=64, n_heads=2, n_layers=2, d_ff=64,
                     seq_len=config["data"]["seq_len"], vocab_size=256)
    assert build_token_mixer(config["attention"], dims).sub_quadratic, (
        f"attention={option} as attention_zoo_long sets it does not claim sub-quadratic cost")
