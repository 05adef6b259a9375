"""Feed-forward activations (Narang et al. 2021): formulas, parameter matching, configs."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import yaml

from conftest import compose_config
from xformer_bench.activation import FeedForward, GatedFeedForward
from xformer_bench.cli import CONF_DIR
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.registry import ACTIVATION

ACTIVATION_DIR = Path(CONF_DIR) / "activation"


def _yaml(name: str) -> dict:
    return yaml.safe_load((ACTIVATION_DIR / f"{name}.yaml").read_text())


# Reference nonlinearities written from their definitions, not from torch's versions.
SELU_SCALE, SELU_ALPHA = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
ELEMENTWISE = {
    "relu": lambda x: torch.where(x > 0, x, torch.zeros_like(x)),
    "gelu": lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2))),
    "swish": lambda x: x / (1 + torch.exp(-x)),
    "elu": lambda x: torch.where(x > 0, x, torch.exp(x) - 1),
    "selu": lambda x: SELU_SCALE * torch.where(x > 0, x, SELU_ALPHA * (torch.exp(x) - 1)),
    "sigmoid": lambda x: 1 / (1 + torch.exp(-x)),
    "softplus": lambda x: torch.log(1 + torch.exp(x)),
    "squared_relu": lambda x: torch.where(x > 0, x * x, torch.zeros_like(x)),
}
GATED = {  # name -> the nonlinearity applied to the gate
    "glu": ELEMENTWISE["sigmoid"],
    "geglu": ELEMENTWISE["gelu"],
    "reglu": ELEMENTWISE["relu"],
    "swiglu": ELEMENTWISE["swish"],
    "liglu": lambda x: x,
}


def _affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = torch.einsum("btd,hd->bth", x, weight)  # (B, T, H)
    return y if bias is None else y + bias


def reference_feedforward(name: str, ffn: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's output recomputed from its own weights and the reference formula."""
    if name in GATED:
        h = ffn.hidden
        weight, bias = ffn.gate_up.weight, ffn.gate_up.bias
        gate = _affine(x, weight[:h], None if bias is None else bias[:h])  # (B, T, h)  x W
        value = _affine(x, weight[h:], None if bias is None else bias[h:])  # (B, T, h)  x V
        hidden = GATED[name](gate) * value
    else:
        hidden = ELEMENTWISE[name](_affine(x, ffn.up.weight, ffn.up.bias))  # (B, T, F)
    return _affine(hidden, ffn.down.weight, ffn.down.bias)  # (B, T, D)


def test_every_activation_has_a_reference_formula():
    assert set(ACTIVATION.names()) == set(ELEMENTWISE) | set(GATED)


@pytest.mark.parametrize("bias", [False, True], ids=["yaml", "with_bias"])
@pytest.mark.parametrize("name", sorted(ELEMENTWISE) + sorted(GATED))
def test_feedforward_matches_reference(name, bias, tiny_dims):
    torch.manual_seed(0)
    spec = {**_yaml(name), "bias": True} if bias and name in GATED else _yaml(name)
    ffn = ACTIVATION.build(spec, dims=tiny_dims).double()
    assert isinstance(ffn, GatedFeedForward if name in GATED else FeedForward)
    for p in ffn.parameters():  # wide pre-activations reach both sides of every kink
        torch.nn.init.normal_(p, std=0.5)
    x = 2 * torch.randn(2, 5, tiny_dims.d_model, dtype=torch.float64)  # (B, T, D)
    y = ffn(x)
    assert y.shape == x.shape
    torch.testing.assert_close(y, reference_feedforward(name, ffn, x), rtol=1e-9, atol=1e-9)


def test_gated_variants_differ_only_by_gate(tiny_dims):
    """Same weights, different gates -> different outputs (the gate is really applied)."""
    torch.manual_seed(0)
    x = torch.randn(1, 4, tiny_dims.d_model)
    outputs = {}
    for name in GATED:
        torch.manual_seed(1)
        outputs[name] = ACTIVATION.build(_yaml(name), dims=tiny_dims)(x)
    names = sorted(outputs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            assert not torch.allclose(outputs[a], outputs[b]), (a, b)


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("d_model,d_ff", [(512, 2048), (64, 256)])
@pytest.mark.parametrize("name", sorted(GATED))
def test_gated_parameter_count_matches_dense(name, d_model, d_ff):
    dims = ModelDims(d_model=d_model, n_heads=4, n_layers=1, d_ff=d_ff, seq_len=8, vocab_size=256)
    dense = _count(ACTIVATION.build(_yaml("relu"), dims=dims))
    assert dense == 2 * d_model * d_ff + d_ff + d_model
    gated = ACTIVATION.build(_yaml(name), dims=dims)
    hidden = round(d_ff * 2 / 3)
    assert gated.hidden == hidden
    assert _count(gated) == 3 * d_model * hidden  # bias-free, as Shazeer (2020) defines it
    assert abs(_count(gated) - dense) / dense < 0.01
    with_bias = ACTIVATION.build({**_yaml(name), "bias": True}, dims=dims)
    assert _count(with_bias) == 3 * d_model * hidden + 2 * hidden + d_model


@pytest.mark.parametrize("name", sorted(GATED))
def test_gated_layers_are_bias_free_by_default(name, tiny_dims):
    ffn = ACTIVATION.build(_yaml(name), dims=tiny_dims)
    assert ffn.gate_up.bias is None and ffn.down.bias is None


def test_liglu_is_a_bilinear_form(tiny_dims):
    """``W2 (W x * V x)`` is homogeneous of degree 2: f(a x) = a^2 f(x) (not with biases)."""
    torch.manual_seed(0)
    ffn = ACTIVATION.build(_yaml("liglu"), dims=tiny_dims).double()
    x = torch.randn(2, 3, tiny_dims.d_model, dtype=torch.float64)
    torch.testing.assert_close(ffn(3 * x), 9 * ffn(x))


def test_d_ff_scale_one_keeps_full_width(tiny_dims):
    spec = {**_yaml("swiglu"), "d_ff_scale": 1.0}
    ffn = ACTIVATION.build(spec, dims=tiny_dims)
    d_model, d_ff = tiny_dims.d_model, tiny_dims.d_ff
    assert ffn.hidden == d_ff
    assert _count(ffn) == 3 * d_model * d_ff


def test_d_ff_scale_too_small_is_an_error(tiny_dims):
    with pytest.raises(ValueError, match="d_ff_scale"):
        ACTIVATION.build({**_yaml("geglu"), "d_ff_scale": 0.001}, dims=tiny_dims)


@pytest.mark.parametrize("path", sorted(ACTIVATION_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_yaml_builds_a_shape_preserving_layer(path, tiny_dims):
    spec = yaml.safe_load(path.read_text())
    ffn = ACTIVATION.build(spec, dims=tiny_dims)
    x = torch.randn(2, 3, tiny_dims.d_model)  # (B, T, D)
    assert ffn(x).shape == x.shape


def test_cli_composes_gated_activation():
    cfg = compose_config("activation=swiglu", "activation.d_ff_scale=1.0")
    assert cfg["activation"] == {**_yaml("swiglu"), "d_ff_scale": 1.0}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE) + sorted(GATED))
def test_tiny_model_forward_backward(name, tiny_dims):
    torch.manual_seed(0)
    model = TransformerLM(
        tiny_dims,
        attention={"name": "full"},
        norm={"name": "layernorm"},
        activation=_yaml(name),
        position={"name": "sinusoidal"},
    )
    tokens = torch.randint(0, tiny_dims.vocab_size, (2, tiny_dims.seq_len))  # (B, T)
    logits = model(tokens)  # (B, T, V)
    assert logits.shape == (2, tiny_dims.seq_len, tiny_dims.vocab_size)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    for param_name, p in model.blocks[0].feedforward.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), param_name
        assert p.grad.abs().sum() > 0, param_name
