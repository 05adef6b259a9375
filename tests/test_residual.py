"""Block-level options: GTrXL's gated residual, RealFormer's residual attention, gradient
checkpointing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config, run_tiny
from xformer_bench.bench.peak_memory import peak_bytes
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.context import ForwardContext
from xformer_bench.models.residual import GATE_BIAS, GRUGate
from xformer_bench.models.residual_attention import ResidualAttention
from xformer_bench.position import Position

SIZES = ("model.d_model=32", "model.n_heads=4", "model.n_layers=3", "model.d_ff=64",
         "data.seq_len=16")


def _model(*overrides: str):
    torch.manual_seed(0)
    return build_model(compose_config(*SIZES, *overrides), 64)


def test_gru_gate_follows_the_gtrxl_equations():
    torch.manual_seed(0)
    gate = GRUGate(8)
    x, y = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    w_r, w_z, w_g = gate.from_branch.weight.chunk(3, dim=0)
    u_r, u_z = gate.from_stream.weight.chunk(2, dim=0)
    u_g = gate.reset_stream.weight
    y_relu = y.relu()
    r = torch.sigmoid(y_relu @ w_r.T + x @ u_r.T)
    z = torch.sigmoid(y_relu @ w_z.T + x @ u_z.T - GATE_BIAS)
    h = torch.tanh(y_relu @ w_g.T + (r * x) @ u_g.T)
    torch.testing.assert_close(gate(x, y), (1 - z) * x + z * h)


def test_gru_gate_starts_near_the_identity():
    """b_g = 2: the update gate opens to ~sigmoid(-2) = 0.12 for small weights."""
    gate = GRUGate(64)
    for p in gate.parameters():
        torch.nn.init.normal_(p, std=1e-3)
    x = torch.randn(4, 64)
    z = torch.sigmoid(torch.tensor(-GATE_BIAS))  # h = tanh(~0) ~ 0
    torch.testing.assert_close(gate(x, torch.randn(4, 64)), (1 - z) * x, atol=0.02, rtol=0.05)


def test_gru_gate_adds_six_d_squared_per_sublayer_and_stays_causal():
    plain, gated = _model(), _model("model.residual=gru_gate")
    extra = gated.num_parameters() - plain.num_parameters()
    assert extra == 3 * 2 * 6 * 32 * 32  # layers x sublayers x 6 D^2
    tokens = torch.randint(0, 64, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 64
    torch.testing.assert_close(gated(tokens)[:, :10], gated(changed)[:, :10])


def test_residual_attention_adds_the_previous_layers_logits():
    torch.manual_seed(0)
    model = _model("model.residual_attention=true", "position=none")
    first, second = (b.attention for b in model.blocks[:2])
    assert isinstance(first, ResidualAttention)
    x = torch.randn(2, 16, 32)
    ctx = ForwardContext(Position(), causal=True)
    out1 = first(x, ctx)  # no previous logits: plain causal attention
    q, k, v = first.project(x)
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(out1, first.out(reference.transpose(1, 2).reshape(2, 16, 32)))
    logits1 = ctx.previous_logits
    torch.testing.assert_close(logits1, q @ k.transpose(-1, -2) / 8 ** 0.5)
    second(x, ctx)
    q2, k2, _ = second.project(x)
    torch.testing.assert_close(ctx.previous_logits, logits1 + q2 @ k2.transpose(-1, -2) / 8 ** 0.5)


def test_residual_attention_stays_causal_and_finite_on_padding():
    model = _model("model.residual_attention=true")
    tokens = torch.randint(0, 64, (1, 16))
    changed = tokens.clone()
    changed[0, 9:] = (changed[0, 9:] + 1) % 64
    torch.testing.assert_close(model(tokens)[:, :9], model(changed)[:, :9])
    block = model.blocks[0].attention
    ctx = ForwardContext(Position(), causal=False,
                         key_padding_mask=torch.ones(1, 16, dtype=torch.bool))
    assert torch.isfinite(block(torch.randn(1, 16, 32), ctx)).all()


@pytest.mark.parametrize("attention", ["local", "performer", "persistent_memory", "fnet"])
def test_residual_attention_needs_a_kernel_that_forms_logits(attention):
    with pytest.raises(ConfigError, match="model.residual_attention=true needs every attention "
                                          f"logit.*which attention={attention} does not provide"):
        _model("model.residual_attention=true", f"attention={attention}")


def test_residual_attention_shares_key_value_heads_for_multi_query():
    model = _model("model.residual_attention=true", "attention=multi_query")
    assert isinstance(model.blocks[0].attention, ResidualAttention)
    assert model.blocks[0].attention.n_kv_heads == 1
    assert torch.isfinite(model(torch.randint(0, 64, (1, 16)))).all()


def test_checkpointing_gives_the_same_gradients_with_less_activation_memory():
    sizes = ("model.n_layers=6", "data.seq_len=64")
    tokens = torch.randint(0, 64, (4, 64))

    def grads_and_peak(*overrides):
        model = _model(*sizes, *overrides).train()

        def step():
            model.zero_grad()
            F.nll_loss(model(tokens).flatten(0, 1), tokens.flatten()).backward()

        peak = peak_bytes(step, torch.device("cpu"))
        return [p.grad.clone() for p in model.parameters()], peak

    plain, plain_peak = grads_and_peak()
    recomputed, recomputed_peak = grads_and_peak("model.checkpointing=true")
    for a, b in zip(plain, recomputed):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert recomputed_peak < 0.6 * plain_peak


def test_checkpointing_with_residual_attention_is_refused():
    with pytest.raises(ConfigError, match="turn one of them off"):
        _model("model.checkpointing=true", "model.residual_attention=true")


@pytest.mark.parametrize("override", ["model.residual=gru_gate", "model.residual_attention=true",
                                      "model.checkpointing=true"])
def test_each_block_option_trains(tmp_path, override):
    record = run_tiny(tmp_path, override, "trainer.max_steps=4")
    assert record["status"] == "finished" and record["steps"] == 4
    assert record["config"]["model"][override.split("=")[0].split(".")[1]] != \
        compose_config()["model"][override.split("=")[0].split(".")[1]]
    assert torch.isfinite(torch.tensor(record["final"]["val/loss"]))


def test_an_unknown_residual_is_one_config_error():
    with pytest.raises(ConfigError, match="model.residual='highway': choose one of add, gru_gate"):
        _model("model.residual=highway")
