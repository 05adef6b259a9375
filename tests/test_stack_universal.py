"""stack=universal: ACT halting (weights sum to 1, ponder cost by hand, forced depths), the
timestep signal, causality, refusals, report, and 2 training steps through the real path."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from conftest import changed_future, compose_config, declared_refusals, SMALL_DIMS, seeded_model, seeded_tokens
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext

SMALL = ("stack=universal", *SMALL_DIMS)
VOCAB = 64
build = partial(seeded_model, *SMALL, vocab_size=VOCAB)  # build(*overrides, seed=0)
tokens = partial(seeded_tokens, vocab_size=VOCAB)  # tokens(seed=0, batch=3, length=16)


def varied_halting(model) -> None:
    """A halting unit whose depth differs from position to position (1 to several steps)."""
    with torch.no_grad():
        model.stack.halt_weight.normal_(0.0, 8.0, generator=torch.Generator().manual_seed(1))
        model.stack.halt_bias.fill_(-0.5)


def by_hand(probabilities: torch.Tensor, threshold: float, max_depth: int):
    """N, R and the weights per position from the (S, B, T) halting probabilities: halt at
    the first step whose running sum exceeds the threshold, or at max_depth."""
    steps, length = probabilities.shape[0], probabilities[0].numel()
    flat = probabilities.reshape(steps, length)
    n, r, w = torch.zeros(length), torch.zeros(length), torch.zeros(steps, length)
    for t in range(length):
        cumulative = 0.0
        for i in range(steps):
            p = flat[i, t].item()
            if cumulative + p > threshold or i == max_depth - 1:
                n[t], r[t], w[i, t] = i + 1, 1 - cumulative, 1 - cumulative
                break
            cumulative += p
            w[i, t] = p
    shape = probabilities.shape[1:]
    return n.view(shape), r.view(shape), w.view(probabilities.shape)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("max_depth", [3, 8])  # 3: some positions halt by the cap, with R
def test_halting_weights_sum_to_one_per_position(train, max_depth):
    model = build(f"stack.max_depth={max_depth}")
    varied_halting(model)
    model.train(train)
    model(tokens())
    weights = model.stack.last_weights  # (S, B, T)
    torch.testing.assert_close(weights.sum(0), torch.ones(weights.shape[1:]), atol=1e-6, rtol=0)
    assert (weights >= 0).all()
    steps = model.stack.last_steps
    assert steps.min() < steps.max(), "the halting unit should give positions different depths"
    if max_depth == 3:
        assert (steps == 3).any() and (model.stack.last_probabilities.sum(0) <= 0.99).any()


@pytest.mark.parametrize("max_depth", [3, 6])
def test_ponder_cost_is_tau_times_mean_n_plus_r_by_hand(max_depth):
    model = build("stack.ponder_cost=0.05", f"stack.max_depth={max_depth}")
    varied_halting(model)
    model.train()
    model(tokens())
    stack = model.stack
    n, r, w = by_hand(stack.last_probabilities, threshold=0.99, max_depth=max_depth)
    assert n.max() == len(stack.last_probabilities)  # the loop ran until the last halted
    torch.testing.assert_close(stack.last_steps, n)
    torch.testing.assert_close(stack.last_remainder, r)
    torch.testing.assert_close(stack.last_weights, w)
    expected = 0.05 * (n + r).mean()
    torch.testing.assert_close(model.auxiliary_loss(), expected)  # the only auxiliary loss
    assert model.auxiliary_loss().requires_grad  # through R
    model.eval()
    model(tokens())
    assert model.auxiliary_loss() is None  # a training objective only


def test_a_unit_that_halts_at_once_applies_the_block_once_with_the_timestep_signal():
    model = build()
    stack = model.stack
    with torch.no_grad():
        stack.halt_weight.zero_()
        stack.halt_bias.fill_(20.0)
    stack.eval()
    x = torch.randn(2, 16, 32) / 32 ** 0.5
    out = stack(x, ForwardContext(model.position))
    assert stack.last_steps.eq(1).all() and len(stack.last_probabilities) == 1
    torch.testing.assert_close(stack.last_remainder, torch.ones(2, 16))
    expected = stack.blocks[0](x + stack.timesteps[1], ForwardContext(model.position))
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(stack.timesteps[1], torch.zeros(32))


def test_a_unit_that_never_halts_runs_max_depth_steps():
    model = build("stack.max_depth=5")
    with torch.no_grad():
        model.stack.halt_weight.zero_()
        model.stack.halt_bias.fill_(-20.0)
    model(tokens())
    stack = model.stack
    assert len(stack.last_probabilities) == 5
    assert stack.last_steps.eq(5).all()
    torch.testing.assert_close(stack.last_remainder, 1 - stack.last_probabilities[:4].sum(0))
    assert model.report()["ponder_steps"] == 5.0


def test_output_is_the_weighted_sum_of_step_states_and_halted_positions_keep_theirs():
    model = build("stack.max_depth=4")
    stack = model.stack
    varied_halting(model)
    stack.eval()
    calls = []  # (input, output) of the block at every step
    stack.blocks[0].register_forward_hook(lambda module, args, out: calls.append((args[0], out)))
    x = model.position.embed(model.embedding(tokens()))  # (B, T, D), what the stack receives
    with torch.no_grad():
        out = stack(x, ForwardContext(model.position))
    n = stack.last_steps  # (B, T)
    assert n.min() < n.max()
    state = x
    for i, (a, new) in enumerate(calls, start=1):
        torch.testing.assert_close(a, state + stack.timesteps[i])
        state = torch.where((i <= n).unsqueeze(-1), new, state)  # halted: the state stays
    expected = sum(w.unsqueeze(-1) * new for w, (_, new) in zip(stack.last_weights, calls))
    torch.testing.assert_close(out, expected)


def test_max_depth_null_is_twice_n_layers_and_the_timestep_signals_differ():
    stack = build().stack
    assert stack.max_depth == 4 and len(stack.blocks) == 1
    assert "unshared_blocks" not in stack.provides and stack.shares_blocks
    assert not torch.allclose(stack.timesteps[1], stack.timesteps[2])


def test_every_step_applies_layer_zero():
    model = build("stack.max_depth=3")
    layers = []
    block = model.stack.blocks[0]
    block.register_forward_pre_hook(lambda module, args: layers.append(args[1].layer))
    with torch.no_grad():
        model.stack.halt_weight.zero_()
        model.stack.halt_bias.fill_(-20.0)
    model(tokens())
    assert layers == [0, 0, 0]


@pytest.mark.parametrize("train", [True, False])
def test_no_position_sees_the_future(train):
    model = build()
    varied_halting(model)
    model.train(train)
    steps_a, steps_b = changed_future(model, tokens(0), 9, tokens(5),
                                      lambda m: m.stack.last_steps.clone())
    assert torch.equal(steps_a[:, :9], steps_b[:, :9])


def test_report_is_the_mean_number_of_steps_of_the_last_forward():
    model = build()
    assert model.stack.report() == {}
    varied_halting(model)
    model(tokens())
    assert model.report()["ponder_steps"] == pytest.approx(model.stack.last_steps.mean().item())
    assert 1.0 <= model.report()["ponder_steps"] <= model.stack.max_depth


@pytest.mark.parametrize("part", ["norm=powernorm", "attention=routing"])
def test_parts_keeping_per_layer_statistics_are_refused_in_one_line(part):
    with pytest.raises(ConfigError) as refused:
        build(part)
    message = str(refused.value)
    assert "\n" not in message and "stack=universal" in message and "choose another" in message
    assert declared_refusals(compose_config(*SMALL, part)) == [message]  # test_composition's view
