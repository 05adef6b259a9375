"""Norm variants against reference formulas, ReZero / Fixup initialisation, and the three
norm placements against hand-written forwards."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
import yaml
from torch import nn

from conftest import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.config import CONF_DIR
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.models.block import PLACEMENTS, Block
from xformer_bench.core.context import ForwardContext
from xformer_bench.models.build import build_model
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.norm.fixup import Fixup, fixup_scale
from xformer_bench.norm.rmsnorm import RMSNorm
from xformer_bench.registry import ACTIVATION, ATTENTION, NORM
from xformer_bench.position import Position

NORM_YAMLS = {p.stem: yaml.safe_load(p.read_text()) for p in (CONF_DIR / "norm").glob("*.yaml")}
REZERO_NORMS = ["rezero", "rezero_layernorm", "rezero_rmsnorm"]


def build_norm(name: str, dim: int) -> nn.Module:
    return NORM.build(NORM_YAMLS[name], dim=dim)


def build_block(dims, norm: str, placement: str) -> Block:
    return Block(
        MultiHeadAttention(dims, ATTENTION.build({"name": "full"}, dims=dims)),
        ACTIVATION.build({"name": "gelu"}, dims=dims),
        lambda: build_norm(norm, dims.d_model),
        placement=placement,
    )


def build_lm(dims, norm: str, placement: str = "pre") -> TransformerLM:
    return TransformerLM(dims, {"name": "full"}, NORM_YAMLS[norm], {"name": "gelu"},
                         {"name": "sinusoidal"}, norm_placement=placement)


def randomise_(module: nn.Module) -> nn.Module:
    """Give every parameter (gains, biases, gates too) a non-trivial value."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * 0.5 + 1.0)
    return module


# ---------------------------------------------------------------- reference formulas


def test_rmsnorm_matches_row_by_row_formula():
    torch.manual_seed(0)
    norm = randomise_(build_norm("rmsnorm", 8))
    x = torch.randn(2, 3, 8) * 3
    expected = torch.empty_like(x)
    for b in range(2):
        for t in range(3):
            row = x[b, t].tolist()
            rms = math.sqrt(sum(v * v for v in row) / len(row) + 1e-6)
            expected[b, t] = torch.tensor([v / rms for v in row]) * norm.weight
    torch.testing.assert_close(norm(x), expected)


def test_scalenorm_gain_starts_at_sqrt_d_and_matches_formula():
    norm = build_norm("scalenorm", 16)
    assert norm.gain.numel() == 1 and norm.gain.item() == pytest.approx(4.0)
    with torch.no_grad():
        norm.gain.fill_(1.7)
    x = torch.randn(2, 5, 16)
    expected = torch.empty_like(x)
    for b in range(2):
        for t in range(5):
            length = math.sqrt(sum(v * v for v in x[b, t].tolist()))
            expected[b, t] = 1.7 * x[b, t] / length
    torch.testing.assert_close(norm(x), expected)
    assert sum(p.numel() for p in norm.parameters()) == 1


def test_adanorm_value_and_detached_gradient():
    torch.manual_seed(0)
    norm = NORM.build({"name": "adanorm", "scale": 2.0, "k": 0.3}, dim=6)
    assert not list(norm.parameters())
    x = torch.randn(4, 6, requires_grad=True)
    weights = torch.randn(4, 6)
    z = norm(x)
    # value: y = LN(x) without affine, z = C (1 - k y) y
    y = torch.empty(4, 6)
    for i in range(4):
        row = x[i].tolist()
        mean = sum(row) / 6
        std = math.sqrt(sum((v - mean) ** 2 for v in row) / 6 + 1e-5)
        y[i] = torch.tensor([(v - mean) / std for v in row])
    torch.testing.assert_close(z, 2.0 * (1 - 0.3 * y) * y)
    # gradient: flows through y only, the factor C (1 - k y) is a constant
    (grad,) = torch.autograd.grad((z * weights).sum(), x)
    factor = 2.0 * (1 - 0.3 * y)
    expected = torch.empty(4, 6)
    for i in range(4):
        jacobian = torch.autograd.functional.jacobian(lambda r: F.layer_norm(r, (6,), eps=1e-5), x[i].detach())
        expected[i] = jacobian.T @ (weights[i] * factor[i])
    torch.testing.assert_close(grad, expected)
    # ... which differs from differentiating through the factor as well
    (full_grad,) = torch.autograd.grad((2.0 * (1 - 0.3 * F.layer_norm(x, (6,), eps=1e-5))
                                        * F.layer_norm(x, (6,), eps=1e-5) * weights).sum(), x)
    assert not torch.allclose(grad, full_grad, atol=1e-4)


def test_powernorm_layer_scale_running_quadratic_mean_and_update():
    torch.manual_seed(0)
    norm = NORM.build({"name": "powernorm", "running_decay": 0.8}, dim=4)
    randomise_(norm)
    norm.running_quadratic_mean.copy_(torch.tensor([0.5, 1.0, 2.0, 4.0]))
    x = torch.randn(2, 3, 4)
    u = x / (x.pow(2).mean(-1, keepdim=True) + 1e-5).sqrt()
    psi2 = torch.tensor([0.5, 1.0, 2.0, 4.0])
    expected = norm.weight * u / (psi2 + 1e-5).sqrt() + norm.bias
    torch.testing.assert_close(norm.train()(x), expected)  # uses the statistic of earlier steps
    batch = torch.stack([u[..., d].pow(2).mean() for d in range(4)])
    torch.testing.assert_close(norm.running_quadratic_mean, 0.8 * psi2 + 0.2 * batch)
    frozen = norm.running_quadratic_mean.clone()
    norm.eval()(x)
    torch.testing.assert_close(norm.running_quadratic_mean, frozen)  # evaluation does not update


def test_powernorm_refuses_shared_blocks():
    """One running statistic updated at every depth would mix the depths: a ConfigError."""
    with pytest.raises(ConfigError, match="norm=powernorm.*share_blocks.*running statistic.*choose another norm"):
        build_model(compose_config("norm=powernorm", "model=shared_blocks"), vocab_size=256)
    build_model(compose_config("norm=rmsnorm", "model=shared_blocks"), vocab_size=256)


def test_powernorm_lm_stays_causal_in_training_mode(tiny_dims):
    torch.manual_seed(0)
    model = build_lm(tiny_dims, "powernorm").train()
    tokens = torch.randint(0, 256, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 256
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = model(tokens)
    model.load_state_dict(before)
    out_changed = model(changed)
    torch.testing.assert_close(out[:, :8], out_changed[:, :8])


# ---------------------------------------------------------------- ReZero and Fixup initialisation


@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
@pytest.mark.parametrize("norm", REZERO_NORMS + ["fixup"])
def test_rezero_and_fixup_blocks_start_as_identity(tiny_dims, norm, placement):
    torch.manual_seed(0)
    model = build_lm(tiny_dims, norm, placement)
    x = torch.randn(2, 8, tiny_dims.d_model) * 2
    for block in model.blocks:
        expected = x
        if placement == "post":  # post-norm normalises the stream itself: N_ff(N_att(x))
            expected = block.norms["feedforward"]["residual"](block.norms["attention"]["residual"](x))
            if norm in ("rezero_layernorm", "rezero_rmsnorm"):
                assert not torch.allclose(expected, x)
        torch.testing.assert_close(block(x, ForwardContext(model.position)), expected, rtol=0,
                                   atol=1e-6)


@pytest.mark.parametrize("norm", REZERO_NORMS)
def test_rezero_gate_is_one_learnable_zero_scalar_per_branch(tiny_dims, norm):
    model = build_lm(tiny_dims, norm)
    gates = [block.gates[s].scale for block in model.blocks for s in ("attention", "feedforward")]
    assert all(g.numel() == 1 and g.item() == 0.0 for g in gates)
    names = [n for n, _ in model.named_parameters() if n.endswith("scale")]
    assert len(names) == 2 * tiny_dims.n_layers  # no gate in the final norm
    F.cross_entropy(model(torch.randint(0, 256, (2, 8))).flatten(0, 1),
                    torch.randint(0, 256, (16,))).backward()
    assert all(g.grad is not None and g.grad.abs().item() > 0 for g in gates)


def test_fixup_scale_formula():
    assert fixup_scale(8, 2) == pytest.approx(8 ** -0.5)
    assert fixup_scale(8, 4) == pytest.approx(8 ** (-1 / 6))
    with pytest.raises(ValueError):
        fixup_scale(8, 1)


def test_fixup_zeroes_output_layers_and_scales_the_others():
    branch = nn.ModuleDict({"up": nn.Linear(4, 8), "gate": nn.Linear(4, 8), "down": nn.Linear(8, 4)})
    before = {n: p.clone() for n, p in branch.named_parameters()}
    Fixup().init_residual_branch(branch, n_branches=9, depth=2)
    assert torch.count_nonzero(branch["down"].weight) == 0 and torch.count_nonzero(branch["down"].bias) == 0
    for name in ("up", "gate"):
        torch.testing.assert_close(branch[name].weight, before[f"{name}.weight"] / 3)
        torch.testing.assert_close(branch[name].bias, before[f"{name}.bias"])  # vectors untouched
    with pytest.raises(ConfigError, match="no residual output"):
        Fixup().init_residual_branch(nn.Linear(4, 4), n_branches=9, depth=2)


def test_fixup_lm_initialisation_relative_to_the_default_one(tiny_dims):
    torch.manual_seed(0)
    reference = build_lm(tiny_dims, "layernorm")
    torch.manual_seed(0)
    fixup = build_lm(tiny_dims, "fixup")
    n_branches = 2 * tiny_dims.n_layers
    for ref_block, block in zip(reference.blocks, fixup.blocks):
        assert torch.count_nonzero(block.attention.out.weight) == 0
        assert torch.count_nonzero(block.feedforward.down.weight) == 0
        torch.testing.assert_close(block.attention.qkv.weight,
                                   ref_block.attention.qkv.weight * n_branches ** (-1 / 6))
        torch.testing.assert_close(block.feedforward.up.weight,
                                   ref_block.feedforward.up.weight * n_branches ** (-1 / 2))
        assert block.gates["attention"].scale.item() == 1.0
    torch.testing.assert_close(fixup.embedding.table.weight, reference.embedding.table.weight)
    assert not any(isinstance(m, nn.LayerNorm) for m in fixup.modules())


# ---------------------------------------------------------------- placements


class ShiftedTwice(nn.Module):
    """A stand-in attention branch: ``2 x + 1`` (takes and ignores the forward context)."""

    def forward(self, x, ctx):
        return 2 * x + 1


def _hand_written(block: Block, placement: str, x: torch.Tensor) -> torch.Tensor:
    attention, feedforward = block.attention, block.feedforward
    na, nf = block.norms["attention"], block.norms["feedforward"]
    ga, gf = block.gates["attention"], block.gates["feedforward"]
    if placement == "pre":
        x = x + ga(attention(na["input"](x), None))
        return x + gf(feedforward(nf["input"](x)))
    if placement == "post":
        x = na["residual"](x + ga(attention(x, None)))
        return nf["residual"](x + gf(feedforward(x)))
    x = x + ga(na["output"](attention(na["input"](x), None)))
    return x + gf(nf["output"](feedforward(nf["input"](x))))


@pytest.mark.parametrize("norm", ["layernorm", "rezero_rmsnorm"])
@pytest.mark.parametrize("placement", ["pre", "post", "sandwich"])
def test_placement_matches_hand_written_forward(tiny_dims, norm, placement):
    torch.manual_seed(0)
    block = randomise_(Block(ShiftedTwice(), ACTIVATION.build({"name": "relu"}, dims=tiny_dims),
                             lambda: build_norm(norm, tiny_dims.d_model), placement=placement))
    x = torch.randn(2, 5, tiny_dims.d_model)
    expected = _hand_written(block, placement, x)
    torch.testing.assert_close(block(x, ForwardContext(Position())), expected)
    placed = [m for m in block.modules() if isinstance(m, (nn.LayerNorm, RMSNorm))]
    assert len(placed) == 2 * len(PLACEMENTS[placement])
    if placement == "sandwich":  # the two norms of a sublayer are distinct modules
        assert block.norms["attention"]["input"] is not block.norms["attention"]["output"]


def test_unknown_placement_is_rejected(tiny_dims):
    with pytest.raises(ValueError, match="norm_placement='middle'"):
        build_block(tiny_dims, "layernorm", "middle")


def test_final_norm_follows_the_placement(tiny_dims):
    assert isinstance(build_lm(tiny_dims, "layernorm", "pre").final_norm, nn.LayerNorm)
    assert isinstance(build_lm(tiny_dims, "layernorm", "sandwich").final_norm, nn.LayerNorm)
    assert isinstance(build_lm(tiny_dims, "layernorm", "post").final_norm, nn.Identity)


# ---------------------------------------------------------------- every norm x placement


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("norm", sorted(NORM_YAMLS))
def test_every_norm_and_placement_trains_a_tiny_lm(tiny_dims, norm, placement):
    torch.manual_seed(0)
    model = build_lm(tiny_dims, norm, placement)
    tokens = torch.randint(0, 256, (2, 12))
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    unused = [n for n, p in model.named_parameters() if p.grad is None]
    assert not unused, f"parameters without gradient (break DDP): {unused}"
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())


def test_every_norm_yaml_builds_a_shape_preserving_norm():
    for spec in NORM_YAMLS.values():
        x = torch.randn(2, 3, 8)
        assert NORM.build(spec, dim=8)(x).shape == x.shape


def test_placement_and_norm_compose_from_the_command_line():
    from xformer_bench.core.dims import ModelDims

    config = compose_config("norm=rezero_rmsnorm", "model.norm_placement=sandwich")
    m = config["model"]
    dims = ModelDims(d_model=16, n_heads=2, n_layers=1, d_ff=32, seq_len=8, vocab_size=256)
    model = TransformerLM(dims, config["attention"], config["norm"], config["activation"],
                          config["position"], norm_placement=m["norm_placement"])
    assert isinstance(model.blocks[0].norms["attention"]["output"].inner, RMSNorm)
