"""Initialisation: no builder's own initialisation is overwritten by the model-wide default,
and the scales the papers ask for survive the model build (the review's findings)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import OPTION_DIMS as SMALL, compose_config, declared_refusals
from xformer_bench.config import CONF_DIR, PLUMBING_GROUPS, choice_groups
from xformer_bench.models import block as block_module
from xformer_bench.models import body as body_module
from xformer_bench.models.build import build_model
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import STANDARD_LAYERS, default_initialised, init_weights
from xformer_bench.models.token_mixer import build_token_mixer

GROUPS = tuple(g for g in choice_groups() if g not in PLUMBING_GROUPS)
VARIANTS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


def at_torch_default(module: nn.Module, name: str, p: torch.Tensor) -> bool:
    """Whether ``p`` still looks drawn from PyTorch's default for its layer: U(+-1/sqrt(fan_in))
    for Linear weights and biases, N(0, 1) for embedding tables (a builder's zeros, constants
    or other scales fail)."""
    if isinstance(module, nn.Linear):
        bound = 1 / math.sqrt(module.in_features)
        return bool(p.abs().max() <= bound * (1 + 1e-6) and p.std() > 0.5 * bound / math.sqrt(3))
    return bool(0.7 < p.std() < 1.3)  # nn.Embedding, nn.EmbeddingBag


def _built_without_the_default(monkeypatch, group: str, name: str) -> nn.Module:
    """The model as its builders leave it: the model-wide default and Fixup's re-init off."""
    monkeypatch.setattr(body_module, "init_weights", lambda *args: None)
    monkeypatch.setattr(block_module.Block, "init_residual_branches", lambda self, n_branches: None)
    config = compose_config(f"{group}={name}", *SMALL)
    torch.manual_seed(0)
    if declared_refusals(config):  # e.g. a bidirectional-only attention: not a causal LM part
        if group != "attention":
            pytest.skip(f"{group}={name} is refused by the default model: {declared_refusals(config)[0]}")
        m = config["model"]
        dims = ModelDims(d_model=m["d_model"], n_heads=m["n_heads"], n_layers=m["n_layers"],
                         d_ff=m["d_ff"], seq_len=config["data"]["seq_len"], vocab_size=256)
        return build_token_mixer(config["attention"], dims)  # its builder's initialisation alone
    return build_model(config, vocab_size=256)


@pytest.mark.parametrize("group,name", VARIANTS, ids=[f"{g}={n}" for g, n in VARIANTS])
def test_the_default_touches_only_standard_layers_left_at_torch_defaults(monkeypatch, group, name):
    model = _built_without_the_default(monkeypatch, group, name)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    defaulted = {n for n, _ in default_initialised(model)}
    owners = dict(model.named_modules())
    for n in defaulted:
        owner = owners[n.rpartition(".")[0]]
        assert isinstance(owner, STANDARD_LAYERS)
        assert at_torch_default(owner, n, before[n]), (
            f"{n} was initialised by its builder but is not marked: the model-wide default "
            "would overwrite it (call core.init.mark_initialised)")
    init_weights(model, d_model=32, n_layers=2)
    for n, p in model.named_parameters():
        if n not in defaulted:
            assert torch.equal(p, before[n]), f"{n}: its builder's initialisation was overwritten"


def test_a_marked_or_raw_parameter_survives_the_default():
    layer = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    layer.raw = nn.Parameter(torch.full((3, 3), 7.0))
    nn.init.constant_(layer[1].weight, 5.0)
    from xformer_bench.core.init import mark_initialised

    mark_initialised(layer[1].weight)
    unmarked = layer[0].weight.detach().clone()
    init_weights(layer, d_model=4, n_layers=1)
    assert torch.all(layer.raw == 7.0) and torch.all(layer[1].weight == 5.0)
    assert not torch.equal(layer[0].weight, unmarked) and torch.all(layer[1].bias == 0)


def test_product_key_memory_keeps_the_authors_scales():
    torch.manual_seed(0)
    model = build_model(compose_config("ffn=product_key_memory"), vocab_size=256)
    memory, d_model = model.blocks[0].feedforward, model.dims.d_model
    bound = (memory.key_dim // 2) ** -0.5  # sub-keys U(+-(key_dim/2)^-1/2), as nn.Linear
    assert memory.sub_keys.abs().max() <= bound
    assert memory.sub_keys.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert memory.values.weight.std().item() == pytest.approx(d_model ** -0.5, rel=0.05)
    # on normalised inputs the top-k softmax is not uniform at initialisation (was 0.1265, k = 8)
    x = model.blocks[0].norms["feedforward"]["input"](torch.randn(1024, d_model))
    scores, _ = memory.lookup(x)
    assert scores.softmax(-1).amax(-1).mean() > 0.15


@pytest.mark.parametrize("embedding", [("embedding=lookup",),
                                       ("embedding=factorized", "embedding.dim=16"),
                                       ("embedding=adaptive_input", "head.tie=false")])
def test_token_vectors_have_the_same_scale_factorised_or_not(embedding):
    """RMS D^-1/2 (Vaswani's unit-scale tokens divided by sqrt(D)); the factorised table used
    to start at 0.22 of the unfactorised scale."""
    torch.manual_seed(0)
    config = compose_config(*embedding)
    model = build_model(config, vocab_size=256)
    vectors = model.embedding(torch.arange(256))  # (V, D)
    rms = vectors.pow(2).mean().sqrt().item() * math.sqrt(model.dims.d_model)
    assert rms == pytest.approx(1.0, abs=0.1)


def test_sinusoids_keep_vaswanis_ratio_to_the_tokens():
    """Token RMS : position RMS = 1 : 1/sqrt(2), as with Vaswani's sqrt(D)-scaled embeddings."""
    torch.manual_seed(0)
    model = build_model(compose_config("position=sinusoidal"), vocab_size=256)
    tokens = model.embedding(torch.arange(128)[None])  # (1, T, D)
    positions = model.position.embed(torch.zeros_like(tokens))  # (1, T, D)
    ratio = positions.pow(2).mean().sqrt() / tokens.pow(2).mean().sqrt()
    assert ratio.item() == pytest.approx(2 ** -0.5, rel=0.1)


def test_the_default_scales_with_width_and_depth():
    """GPT-NeoX: SmallInit sqrt(2/(5d)) for matrices, 2/(L sqrt(d)) for residual outputs."""
    torch.manual_seed(0)
    model = build_model(compose_config("model.d_model=256", "model.n_layers=8"), vocab_size=256)
    attention, ffn = model.blocks[0].attention, model.blocks[0].feedforward
    assert attention.qkv.weight.std().item() == pytest.approx((2 / (5 * 256)) ** 0.5, rel=0.02)
    for residual_output in (attention.out.weight, ffn.down.weight):
        assert residual_output.std().item() == pytest.approx(2 / (8 * 16), rel=0.02)
