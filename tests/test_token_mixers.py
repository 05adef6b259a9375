"""The `attention` group builds token mixers: a throw-away mixer with no queries or keys and a
throw-away kernel with projections of its own, registered inside this test only, train
through the CLI's job path without any change to Block, TransformerLM or run.py; their
declared capabilities refuse the positions they cannot serve, in one line, before training."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xformer_bench.config as config_module
from conftest import TINY_RUN, compose_config
from xformer_bench import cli
from xformer_bench.attention import AttentionKernel, TokenMixer
from xformer_bench.config import CONF_DIR, choice_groups
from xformer_bench.models.build import build_model
from xformer_bench.registry import ATTENTION


class CumulativeMean(TokenMixer):
    """No q, no k: position t mixes the mean of positions <= t (all positions if bidirectional)."""

    provides = frozenset({"causal", "bidirectional", "variable_length"})

    def __init__(self, dims):
        super().__init__()
        self.out = nn.Linear(dims.d_model, dims.d_model)

    def forward(self, x, ctx):  # (B, T, D)
        if not ctx.causal:
            return self.out(x.mean(1, keepdim=True).expand_as(x))
        count = torch.arange(1, x.shape[1] + 1, device=x.device, dtype=x.dtype)[:, None]  # (T, 1)
        return self.out(x.cumsum(1) / count)


class ProjectedKeys(AttentionKernel):
    """Softmax attention whose keys pass through a learned head-dim projection of its own."""

    provides = frozenset({"causal", "bidirectional", "variable_length"})  # no additive bias

    def __init__(self, dims):
        super().__init__()
        self.key_map = nn.Linear(dims.head_dim, dims.head_dim, bias=False)

    def forward(self, q, k, v, *, causal, bias=None, key_padding_mask=None, layer=0):
        return F.scaled_dot_product_attention(q, self.key_map(k), v, is_causal=causal)


THROW_AWAY = {"cumulative_mean": CumulativeMean, "projected_keys": ProjectedKeys}


@pytest.fixture
def throw_away_options(tmp_path, monkeypatch):
    """Both registered and given a YAML, in a copy of conf/, for this test only."""
    conf = tmp_path / "conf"
    shutil.copytree(CONF_DIR, conf)
    ATTENTION.names()  # load the real ones first
    for name, builder in THROW_AWAY.items():
        monkeypatch.setitem(ATTENTION._builders, name, builder)
        (conf / "attention" / f"{name}.yaml").write_text(f"name: {name}\nlabel: {name}\n")
    monkeypatch.setattr(config_module, "CONF_DIR", conf)


def run_job(tmp_path, *overrides: str):
    overrides = (*TINY_RUN, "trainer.max_steps=30", f"paths.results_dir={tmp_path / 'results'}",
                 *overrides)
    config = compose_config(*overrides)
    choices = {g: config[g]["name"] for g in choice_groups() if "name" in config.get(g, {})}
    return cli.run_job(config, choices, list(overrides), tmp_path / "run", multirun=False)


@pytest.mark.parametrize("name", sorted(THROW_AWAY))
def test_a_throw_away_option_trains_through_the_cli(name, throw_away_options, tmp_path, capsys):
    final_bpb = run_job(tmp_path, f"attention={name}", "position=sinusoidal")
    assert math.isfinite(final_bpb) and final_bpb < 8.0 - 0.5  # learned below uniform bytes
    assert f"attention: {name}" not in capsys.readouterr().err
    [record] = [r for r in (tmp_path / "results").rglob("*.json")]
    assert f'"attention": "{name}"' in record.read_text()


def test_the_kernels_own_parameters_are_the_models(throw_away_options):
    small = ("model.d_model=32", "model.n_heads=2", "model.n_layers=3", "model.d_ff=64")
    full = build_model(compose_config("attention=full", *small), vocab_size=256)
    projected = build_model(compose_config("attention=projected_keys", *small), vocab_size=256)
    assert projected.num_parameters() - full.num_parameters() == 3 * 16 * 16  # L * Dh * Dh


@pytest.mark.parametrize(("name", "position", "needs"), [
    ("cumulative_mean", "rotary", "queries and keys"),
    ("projected_keys", "t5", "an additive attention bias"),
])
def test_a_position_the_option_cannot_serve_is_one_line_before_training(
        name, position, needs, throw_away_options, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        run_job(tmp_path, f"attention={name}", f"position={position}")
    assert exit_.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: position={position} needs {needs}"
                    f"{' (rotary positions)' if position == 'rotary' else ' (T5, ALiBi, Shaw)'}, "
                    f"which attention={name} does not provide; choose another position or attention")
    assert not (tmp_path / "results").exists()  # nothing ran, nothing recorded
