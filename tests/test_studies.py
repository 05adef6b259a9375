"""Studies declare sweeps over options that exist, a baseline row inside the sweep, and the
attention zoo covers exactly the causal-capable attention options."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from xformer_bench.config import CONF_DIR
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer

STUDIES = sorted(p for p in (CONF_DIR / "experiment").glob("*.yaml")
                 if "sweep" in OmegaConf.load(p))


def sweep_of(path: Path) -> dict[str, list[str]]:
    sweep = OmegaConf.load(path).sweep
    return {key: str(values).split(",") for key, values in sweep.items()}


@pytest.mark.parametrize("path", STUDIES, ids=[p.stem for p in STUDIES])
def test_a_study_sweeps_existing_options_and_contains_its_baseline(path):
    sweep = sweep_of(path)
    for group, options in sweep.items():
        if (CONF_DIR / group).is_dir():
            missing = [o for o in options if not (CONF_DIR / group / f"{o}.yaml").is_file()]
            assert not missing, f"{path.stem} sweeps unknown {group} options {missing}"
    baseline = OmegaConf.load(path).get("baseline")
    assert baseline is not None, f"{path.stem} declares no baseline row"
    for group, option in baseline.items():
        assert option in sweep.get(group, [option]), f"{path.stem}: baseline {group}={option}"


def test_the_zoo_covers_every_causal_capable_attention_and_modern_mixers_the_recurrent():
    dims = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=64, vocab_size=256)
    causal = sorted(p.stem for p in (CONF_DIR / "attention").glob("*.yaml")
                    if "causal" in build_token_mixer(
                        OmegaConf.to_container(OmegaConf.load(p)), dims).provides)
    recurrent = {p.stem for p in (CONF_DIR / "attention").glob("*.yaml")
                 if OmegaConf.load(p).get("family") == "recurrent"}
    zoo = sweep_of(CONF_DIR / "experiment" / "attention_zoo.yaml")["attention"]
    assert sorted(zoo) == sorted(set(causal) - recurrent)  # the survey's zoo
    for study in ("modern_mixers", "modern_mixers_mqar"):  # the mixers that followed it
        assert recurrent <= set(sweep_of(CONF_DIR / "experiment" / f"{study}.yaml")["attention"])
