"""stack=conditional: soft gates in training, hard gates in evaluation (a closed gate leaves the
state exactly as it was), the budget loss, the open start, causality, report, refusals, and
2 training steps through the real path."""

from __future__ import annotations

from functools import partial

import math

import pytest
import torch

from conftest import changed_future, SMALL_DIMS, seeded_model, seeded_tokens
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext

SMALL = ("stack=conditional", *SMALL_DIMS)
VOCAB = 64
build = partial(seeded_model, *SMALL, vocab_size=VOCAB)  # build(*overrides, seed=0)
tokens = partial(seeded_tokens, vocab_size=VOCAB)  # tokens(seed=0, batch=3, length=16)


def varied_gates(model) -> None:
    """Gates that open for some tokens and close for others."""
    with torch.no_grad():
        model.stack.gate_weight.normal_(0.0, 8.0, generator=torch.Generator().manual_seed(1))
        model.stack.gate_bias.zero_()


def gate_on_first_coordinate(stack) -> None:
    """g = sigmoid(x_0): open where the first coordinate is positive, closed where negative."""
    with torch.no_grad():
        stack.gate_weight.zero_()
        stack.gate_weight[:, 0] = 1.0
        stack.gate_bias.zero_()


def test_every_layer_starts_open_at_every_position():
    model = build()
    assert model.stack.gate_bias.tolist() == [3.0, 3.0]
    model(tokens())
    torch.testing.assert_close(model.stack.last_gates,
                               torch.full((2, 3, 16), 1 / (1 + math.exp(-3))))
    assert model.report()["executed_fraction"] == 1.0
    assert len(model.stack.blocks) == 2


def test_a_closed_gate_in_evaluation_leaves_the_state_unchanged():
    model = build()
    stack = model.stack
    gate_on_first_coordinate(stack)
    stack.eval()
    x = torch.randn(2, 16, 32)
    x[:, :, 0] = 10.0
    x[:, 5, 0] = -10.0  # position 5: closed at every layer (its state never changes)
    out = stack(x, ForwardContext(model.position))
    assert torch.equal(out[:, 5], x[:, 5])
    assert (stack.last_gates[:, :, 5] < 0.5).all()
    open_positions = [t for t in range(16) if t != 5]
    assert not torch.allclose(out[:, open_positions], x[:, open_positions])
    assert stack.report()["executed_fraction"] == pytest.approx(
        (stack.last_gates > 0.5).float().mean().item())


def test_evaluation_runs_a_layer_whole_and_training_mixes_it_by_the_soft_gate():
    model = build("model.n_layers=1")
    stack = model.stack
    gate_on_first_coordinate(stack)
    x = torch.randn(2, 16, 32)
    x[:, :8, 0] = 0.7  # open, g ~ 0.67
    x[:, 8:, 0] = -0.7  # closed, g ~ 0.33
    ctx = ForwardContext(model.position)
    y = stack.blocks[0](x, ctx)  # (B, T, D)
    g = torch.sigmoid(x[..., 0]).unsqueeze(-1)  # (B, T, 1)
    stack.train()
    torch.testing.assert_close(stack(x, ctx), x + g * (y - x))
    stack.eval()
    torch.testing.assert_close(stack(x, ctx), torch.cat([y[:, :8], x[:, 8:]], dim=1))
    assert stack.report()["executed_fraction"] == 0.5


def test_budget_loss_is_weight_times_squared_gap_to_the_target_fraction():
    model = build("stack.budget_weight=2.0", "stack.target_fraction=0.25")
    varied_gates(model)
    model.train()
    model(tokens())
    gates = model.stack.last_gates  # (L, B, T)
    assert 0.0 < (gates > 0.5).float().mean() < 1.0
    expected = 2.0 * (gates.mean() - 0.25) ** 2
    torch.testing.assert_close(model.auxiliary_loss(), expected)  # the only auxiliary loss
    model.auxiliary_loss().backward()
    assert model.stack.gate_bias.grad.abs().sum() > 0
    model.eval()
    model(tokens())
    assert model.auxiliary_loss() is None  # a training objective only


@pytest.mark.parametrize("train", [True, False])
def test_no_position_sees_the_future(train):
    model = build()
    varied_gates(model)
    model.train(train)
    gates_a, gates_b = changed_future(model, tokens(0), 9, tokens(5),
                                      lambda m: m.stack.last_gates.clone())
    torch.testing.assert_close(gates_a[:, :, :9], gates_b[:, :, :9])


def test_shared_blocks_apply_one_block_as_layer_zero_with_a_gate_per_depth():
    model = build("model.share_blocks=true", "model.n_layers=3")
    stack = model.stack
    assert len(stack.blocks) == 1 and stack.gate_weight.shape == (3, 32)
    assert "unshared_blocks" not in stack.provides
    layers = []
    stack.blocks[0].register_forward_pre_hook(lambda module, args: layers.append(args[1].layer))
    model(tokens())
    assert layers == [0, 0, 0]


def test_unshared_blocks_accept_per_layer_statistics_and_shared_ones_refuse_them():
    build("norm=powernorm")  # a block per depth: PowerNorm's running statistic is per layer
    with pytest.raises(ConfigError) as refused:
        build("norm=powernorm", "model.share_blocks=true")
    assert "\n" not in str(refused.value) and "choose another" in str(refused.value)
