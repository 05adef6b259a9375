"""The systems of the survey as ``model=`` presets: every preset names its paper, trains two
steps on byte LM through the real path, or is refused in one line where its parts declare it
impossible (a bidirectional-only system in the decoder LM); the command line still wins."""

from __future__ import annotations

import pytest

from conftest import compose_config, declared_refusals, run_tiny
from xformer_bench.config import CONF_DIR
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model

PRESETS = sorted(p.stem for p in (CONF_DIR / "model").glob("*.yaml"))
SMALL = ("model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64",
         "data.seq_len=32")


def test_every_preset_names_itself_and_its_paper():
    for name in PRESETS:
        text = (CONF_DIR / "model" / f"{name}.yaml").read_text()
        config = compose_config(f"model={name}")
        assert config["model"]["name"] == name and config["model"]["label"]
        comment = " ".join(line for line in text.splitlines() if line.startswith("#"))
        assert any(ch.isdigit() for ch in comment), f"{name}.yaml cites no paper (year)"


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_trains_two_steps_or_is_refused_in_one_line(preset, tmp_path):
    refusals = declared_refusals(compose_config(f"model={preset}", *SMALL))
    if refusals:
        with pytest.raises(ConfigError) as error:
            build_model(compose_config(f"model={preset}", *SMALL), 256)
        assert "\n" not in str(error.value) and refusals[0].split(",")[0] in str(error.value)
        return
    hybrid = compose_config(f"model={preset}")["model"].get("hybrid")  # needs two layers
    record = run_tiny(tmp_path, f"model={preset}", "trainer.max_steps=2",
                      *(["model.n_layers=2"] if hybrid else []))
    assert record["status"] == "finished" and record["steps"] == 2
    assert record["choices"]["model"] == preset


def test_the_command_line_still_wins_over_a_preset():
    config = compose_config("model=performer", "attention=local", "model.d_model=64")
    assert config["attention"]["name"] == "local" and config["model"]["d_model"] == 64
    assert config["model"]["name"] == "performer"
