"""RetNet's heads (Sun et al. 2023, "Retentive Network", section 2.2): gamma_h = 1 - 2^(-5-h)
over H heads.  The paper's heads are 256 wide (8 of them at its smallest model, d = 2048); at
our studies' widths d / 256 would leave one head -- one decay, no multi-scale retention -- so
the model's heads are taken there (``attention/retnet.py``)."""

from __future__ import annotations

import pytest
import torch
import yaml

from conftest import compose_config
from xformer_bench.attention.retnet import MultiScaleRetention
from xformer_bench.config import CONF_DIR
from xformer_bench.core.dims import ModelDims
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.models.token_mixer import build_token_mixer


def retnet(d_model: int = 128, model_heads: int = 4, **overrides) -> MultiScaleRetention:
    spec = yaml.safe_load((CONF_DIR / "attention" / "retnet.yaml").read_text())
    dims = ModelDims(d_model=d_model, n_heads=model_heads, n_layers=1, d_ff=64, seq_len=32,
                     vocab_size=64)
    with torch.device("meta"):  # shapes only: no memory, no initialisation
        return build_token_mixer({**spec, **overrides}, dims)


def test_at_the_studies_width_retnet_has_the_models_heads_and_their_decays():
    """d_model 128, model.n_heads 4 (the narang_base scale of modern_mixers): 4 heads of 32,
    gamma 1 - 2^-5 .. 1 - 2^-8 (half-lives ~22 .. ~177 positions).  d / 256 gave 1 head."""
    config = compose_config("attention=retnet")
    assert (config["model"]["d_model"], config["model"]["n_heads"]) == (128, 4)
    layers = [m for m in build_model(config, 256).modules()
              if isinstance(m, MultiScaleRetention)]
    assert len(layers) == config["model"]["n_layers"]
    for layer in layers:
        assert layer.heads == 4 and layer.scale == 32 ** -0.5
        gamma = layer.log_decay.flatten().double().exp()
        torch.testing.assert_close(gamma, 1 - 2.0 ** (-5 - torch.arange(4.0, dtype=torch.float64)),
                                   rtol=0, atol=1e-7)
        assert len(set(gamma.tolist())) == 4


@pytest.mark.parametrize("d_model, model_heads, overrides, heads", [
    (2048, 8, {}, 8),               # the paper's 1.3B: 8 heads of 256
    (2048, 4, {}, 8),               # heads of at most 256, whatever the model's
    (4096, 16, {}, 16),             # the paper's 6.7B
    (512, 8, {}, 8),                # below 256 x n_heads: the model's heads, 64 wide
    (128, 4, {"n_heads": 2}, 2),    # n_heads overrides both
    (128, 4, {"head_dim": 16}, 8),  # a narrower cap: more heads than the model's
    (128, 4, {"head_dim": None}, 4),  # no cap: the model's heads
])
def test_heads_are_the_papers_256_wide_where_the_width_holds_them(d_model, model_heads,
                                                                   overrides, heads):
    assert retnet(d_model, model_heads, **overrides).heads == heads


def test_the_value_width_may_be_any_whole_multiple_of_the_heads():
    """``expand_v`` is what ``match_params: {by: mixer}`` re-solves: 84 / 128 is 84 channels,
    21 a head; 0.6 x 128 is not whole and 0.625 x 128 = 80 does not split into 3 heads."""
    layer = retnet(expand_v=84 / 128)
    assert layer.v.weight.shape == layer.g.weight.shape == (84, 128)
    assert layer.out.weight.shape == (128, 84)
    with pytest.raises(ConfigError, match="expand_v=0.6: attention=retnet needs"):
        retnet(expand_v=0.6)
    with pytest.raises(ConfigError, match="whole multiple of its 3 heads"):
        retnet(96, 3, expand_v=80 / 96)
