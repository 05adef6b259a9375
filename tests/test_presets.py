"""The systems of the survey as ``model=`` presets: every preset names its paper, trains two
steps on byte LM, or is refused in one line where its parts declare it impossible (a
bidirectional-only system in the decoder LM); the command line still wins.  Every preset trains
in-process in the fast suite; through the real path (Lightning, the record) a few
representatives do, and every preset under ``slow`` (make test-full)."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_config, declared_refusals, run_tiny, two_training_steps
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


REAL_PATH = ("samba", "transformer_xl", "universal_transformer")
"""The presets trained through the real path in the fast suite: a hybrid layout (needs two
layers), a recurrent memory, an adaptive-depth stack with its auxiliary loss."""


@pytest.mark.parametrize("preset", PRESETS)
def test_a_preset_trains_two_steps_in_process_or_is_refused_in_one_line(preset):
    config = compose_config(f"model={preset}", *SMALL)
    refusals = declared_refusals(config)
    torch.manual_seed(0)
    if refusals:
        with pytest.raises(ConfigError) as error:
            build_model(config, 256)
        assert "\n" not in str(error.value) and refusals[0].split(",")[0] in str(error.value)
        return
    assert config["model"]["name"] == preset
    model = build_model(config, 256)
    losses = two_training_steps(model, length=32)
    assert all(torch.isfinite(torch.tensor(losses))), f"model={preset}: losses {losses}"
    assert losses[1] != losses[0], "the step must change the model"


def test_the_real_path_representatives_are_presets_that_train():
    assert set(REAL_PATH) <= set(PRESETS)
    assert all(not declared_refusals(compose_config(f"model={p}", *SMALL)) for p in REAL_PATH)


@pytest.mark.parametrize("preset", [pytest.param(p, marks=() if p in REAL_PATH else
                                                 pytest.mark.slow) for p in PRESETS])
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
