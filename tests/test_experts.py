"""The "Experts" rows of Narang et al. (2021): mixture of experts, Switch, product-key memory.

Every layer is checked against a reference written here from the papers' definitions: a
per-token loop over experts with capacity counters, the load-balancing formula, and a
brute-force search over all memory keys."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from xformer_bench.config import CONF_DIR
from xformer_bench.ffn import RoutedExperts, route
from xformer_bench.ffn.product_key_memory import ProductKeyMemory
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import Position
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.registry import FFN
from xformer_bench.tasks.lm import LanguageModelTask

FFN_DIR = Path(CONF_DIR) / "ffn"
ROUTED = {"moe": 2, "switch": 1}  # name -> experts per token
RELU = {"name": "relu"}
SWIGLU = {"name": "swiglu"}


def _yaml(name: str) -> dict:
    return yaml.safe_load((FFN_DIR / f"{name}.yaml").read_text())


def _routed(name: str, dims: ModelDims, **overrides) -> RoutedExperts:
    return FFN.build({**_yaml(name), **overrides}, dims=dims, activation=RELU)


def _model(ffn: dict, dims: ModelDims, activation: dict = RELU, **options) -> TransformerLM:
    return TransformerLM(dims, attention={"name": "full"}, norm={"name": "layernorm"},
                         activation=activation, position={"name": "sinusoidal"}, ffn=ffn, **options)


def _capacity(cf: float, top_k: int, n_tokens: int, n_experts: int) -> int:
    return math.ceil(cf * top_k * n_tokens / n_experts)  # Fedus et al. eq. 3, times k (GShard)


def reference_routed(layer: RoutedExperts, x: torch.Tensor, capacity: int):
    """Per-token loop: first choices of all tokens claim slots before any second choice."""
    tokens = x.reshape(-1, x.shape[-1])  # (N, D)
    probs = torch.softmax(tokens @ layer.router.weight.T, dim=-1)  # (N, E)
    k = layer.top_k
    choice = probs.argsort(dim=-1, descending=True)[:, :k]  # (N, k)
    chosen = probs.gather(-1, choice)  # (N, k)
    gates = chosen / chosen.sum(-1, keepdim=True) if k > 1 else chosen
    load = [0] * len(layer.experts)
    out = torch.zeros_like(tokens)
    for c in range(k):
        for t in range(len(tokens)):
            e = int(choice[t, c])
            if load[e] < capacity:
                load[e] += 1
                out[t] += gates[t, c] * layer.experts[e](tokens[t:t + 1])[0]
    return out.view_as(x), load


def reference_balance_loss(layer: RoutedExperts, x: torch.Tensor) -> torch.Tensor:
    """``weight * E * sum_i f_i P_i`` with f_i from each token's argmax (Fedus et al. eq. 4)."""
    tokens = x.reshape(-1, x.shape[-1])  # (N, D)
    probs = torch.softmax(tokens @ layer.router.weight.T, dim=-1)  # (N, E)
    e = probs.shape[-1]
    f = torch.stack([(probs.argmax(-1) == i).float().mean() for i in range(e)])
    p = torch.stack([probs[:, i].mean() for i in range(e)])
    return layer.aux_loss_weight * e * (f * p).sum()


def _skewed(name: str, dims: ModelDims, capacity_factor: float):
    """A router that sends every token to expert 0 first and expert 1 second."""
    torch.manual_seed(0)
    layer = _routed(name, dims, num_experts=4, capacity_factor=capacity_factor)
    with torch.no_grad():
        layer.router.weight.normal_(std=0.05)
        layer.router.weight[0, 0], layer.router.weight[1, 0] = 5.0, 4.0
    x = torch.randn(2, 6, dims.d_model)  # (B, T, D)
    x[..., 0] = 3.0
    return layer, x


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_capacity_is_respected_and_overflow_outputs_zero(name, tiny_dims):
    layer, x = _skewed(name, tiny_dims, capacity_factor=1.0)
    layer.train()
    k, n = ROUTED[name], 12
    cap = _capacity(1.0, k, n, 4)
    y = layer(x).reshape(n, -1)  # (N, D)
    # Tokens arrive in order: the first `cap` fill experts 0 (and 1); the rest are dropped.
    assert torch.all(y[cap:] == 0)
    assert torch.all(y[:cap].abs().sum(-1) > 0)
    _, load = reference_routed(layer, x, cap)
    assert max(load) == cap and load == ([cap, cap, 0, 0] if k == 2 else [cap, 0, 0, 0])
    routed = route(torch.softmax(x.reshape(n, -1) @ layer.router.weight.T, -1), k, cap)
    per_expert = torch.bincount(routed.expert[routed.kept], minlength=4)
    assert per_expert.max() <= cap and per_expert.sum() == sum(load)


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_eval_drops_nothing(name, tiny_dims):
    """The choice made for causality: capacity applies in training only."""
    layer, x = _skewed(name, tiny_dims, capacity_factor=1.0)
    layer.eval()
    ctx = ForwardContext(Position())
    y = layer(x, ctx)
    assert torch.all(y.flatten(0, 1).abs().sum(-1) > 0)
    torch.testing.assert_close(y, reference_routed(layer, x, capacity=10**9)[0])
    assert ctx.aux_losses == []  # balancing is a training objective


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("activation", [RELU, SWIGLU], ids=["relu", "swiglu"])
@pytest.mark.parametrize("name", sorted(ROUTED))
def test_output_equals_per_token_reference(name, activation, training, tiny_dims):
    torch.manual_seed(1)
    layer = FFN.build({**_yaml(name), "capacity_factor": 0.75}, dims=tiny_dims,
                      activation=activation).train(training)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.3)
    x = torch.randn(3, 8, tiny_dims.d_model)  # (B, T, D)
    k, e = ROUTED[name], 8
    cap = _capacity(0.75, k, 24, e) if training else 10**9
    expected, load = reference_routed(layer, x, cap)
    if training:  # the reference did drop something, so capacity is exercised
        assert sum(load) < k * 24
    torch.testing.assert_close(layer(x), expected, atol=1e-5, rtol=1e-5)


def test_top2_gates_sum_to_one_and_are_renormalised_probabilities():
    torch.manual_seed(2)
    probs = torch.softmax(torch.randn(10, 5), -1)  # (N, E)
    routed = route(probs, top_k=2, capacity=10)
    gates = routed.gate.view(2, 10)  # (K, N), choice-major
    torch.testing.assert_close(gates.sum(0), torch.ones(10))
    top = probs.sort(-1, descending=True).values[:, :2]  # (N, 2)
    torch.testing.assert_close(gates.T, top / top.sum(-1, keepdim=True))
    assert torch.equal(routed.expert.view(2, 10).T, probs.argsort(-1, descending=True)[:, :2])
    switch = route(probs, top_k=1, capacity=10)  # top-1 keeps the raw probability
    torch.testing.assert_close(switch.gate, probs.max(-1).values)


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_aux_loss_matches_formula(name, tiny_dims):
    torch.manual_seed(3)
    layer = _routed(name, tiny_dims).train()
    with torch.no_grad():
        layer.router.weight.normal_(std=0.5)
    x = torch.randn(2, 8, tiny_dims.d_model)  # (B, T, D)
    ctx = ForwardContext(Position())
    layer(x, ctx)
    expected = reference_balance_loss(layer, x)
    [loss] = ctx.aux_losses
    torch.testing.assert_close(loss, expected)
    assert expected > 0.01  # weight 0.01 times a balance loss >= ~1
    layer(x, ctx)
    assert len(ctx.aux_losses) == 2  # one per application


@pytest.mark.filterwarnings("ignore:You are trying to `self.log\\(\\)`")
@pytest.mark.parametrize("name", sorted(ROUTED))
def test_aux_loss_is_added_to_the_training_loss(name, tiny_dims):
    torch.manual_seed(4)
    model = _model(_yaml(name), tiny_dims)
    task = LanguageModelTask(model, optim={}, max_steps=1).train()
    inputs = torch.randint(0, 256, (2, tiny_dims.seq_len))  # (B, T)
    targets = torch.randint(0, 256, (2, tiny_dims.seq_len))  # (B, T)
    ffn_inputs = []
    hooks = [b.feedforward.register_forward_hook(lambda m, a, o: ffn_inputs.append((m, a[0])))
             for b in model.blocks]
    loss = task.training_step((inputs, targets), 0)
    for h in hooks:
        h.remove()
    aux = sum(reference_balance_loss(m, x) for m, x in ffn_inputs)
    assert len(ffn_inputs) == tiny_dims.n_layers
    torch.testing.assert_close(model.auxiliary_loss(), aux)
    ce = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss - ce, aux)
    assert aux > 0


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_shared_blocks_count_every_applications_auxiliary_loss(name, tiny_dims):
    """One block applied L times balances its router L times: L losses, not the last one."""
    torch.manual_seed(5)
    model = _model(_yaml(name), tiny_dims, share_blocks=True).train()
    router_inputs = []
    model.blocks[0].feedforward.register_forward_hook(lambda m, a, o: router_inputs.append(a[0]))
    model(torch.randint(0, 256, (2, tiny_dims.seq_len)))
    layer = model.blocks[0].feedforward
    assert len(router_inputs) == tiny_dims.n_layers == 2
    expected = sum(reference_balance_loss(layer, x) for x in router_inputs)
    torch.testing.assert_close(model.auxiliary_loss(), expected)


def _expert_params(activation: dict, d: int, f: int) -> int:
    if activation["name"] == "swiglu":
        return 3 * d * round(f * 2 / 3)  # bias-free (Shazeer 2020)
    return 2 * d * f + f + d


@pytest.mark.parametrize("activation", [RELU, SWIGLU], ids=["relu", "swiglu"])
@pytest.mark.parametrize("name", sorted(ROUTED))
def test_active_parameters_exclude_unchosen_experts(name, activation, tiny_dims):
    model = _model(_yaml(name), tiny_dims, activation)
    dense = _model(_yaml("dense"), tiny_dims, activation)
    d, f, e = tiny_dims.d_model, tiny_dims.d_ff, _yaml(name)["num_experts"]
    per_expert = _expert_params(activation, d, f)
    layers = tiny_dims.n_layers
    # Experts replace one dense feed-forward each; the router adds d * E per layer.
    assert model.num_parameters() == dense.num_parameters() + layers * ((e - 1) * per_expert + d * e)
    inactive = layers * (e - ROUTED[name]) * per_expert
    assert model.num_parameters() - model.num_active_parameters() == inactive
    assert model.num_active_parameters() < model.num_parameters()


def reference_memory(memory: ProductKeyMemory, x: torch.Tensor):
    """Score all num_keys ** 2 concatenated keys by brute force."""
    tokens = x.reshape(-1, x.shape[-1])  # (N, D)
    q = (tokens @ memory.query.weight.T + memory.query.bias).view(len(tokens), memory.heads, -1)
    n_keys, out, indices = memory.num_keys, torch.zeros_like(tokens), []
    for h in range(memory.heads):
        keys = torch.cat([memory.sub_keys[h, 0].repeat_interleave(n_keys, 0),
                          memory.sub_keys[h, 1].repeat(n_keys, 1)], dim=-1)  # (K*K, Dk)
        scores = q[:, h] @ keys.T  # (N, K*K)
        best, index = scores.topk(memory.topk, dim=-1)  # (N, k)
        out += torch.einsum("nk,nkd->nd", torch.softmax(best, -1), memory.values.weight[index])
        indices.append(index)
    return out.view_as(x), torch.stack(indices, 1)  # (B, T, D), (N, H, k)


def test_product_keys_find_the_brute_force_top_k(tiny_dims):
    torch.manual_seed(5)
    memory = FFN.build({"name": "product_key_memory", "num_keys": 6, "heads": 2, "topk": 4,
                        "key_dim": 8}, dims=tiny_dims, activation=RELU)
    for p in memory.parameters():
        torch.nn.init.normal_(p)
    x = torch.randn(2, 5, tiny_dims.d_model)  # (B, T, D)
    expected, expected_index = reference_memory(memory, x)
    _, index = memory.lookup(x.reshape(10, -1))
    assert torch.equal(index.sort(-1).values, expected_index.sort(-1).values)
    torch.testing.assert_close(memory(x), expected, atol=1e-5, rtol=1e-5)
    assert memory.memory_size == 36
    assert memory.inactive_parameters() == (36 - 2 * 4) * tiny_dims.d_model


def test_product_key_memory_rejects_bad_sizes(tiny_dims):
    with pytest.raises(ValueError, match="topk"):
        FFN.build({**_yaml("product_key_memory"), "num_keys": 4, "topk": 8},
                  dims=tiny_dims, activation=RELU)
    with pytest.raises(ValueError, match="key_dim"):
        FFN.build({**_yaml("product_key_memory"), "key_dim": 7}, dims=tiny_dims, activation=RELU)


@pytest.mark.parametrize("path", sorted(FFN_DIR.glob("*.yaml")), ids=lambda p: p.stem)
def test_every_yaml_builds_with_either_activation_shape(path, tiny_dims):
    spec = yaml.safe_load(path.read_text())
    for activation in (RELU, SWIGLU):
        layer = FFN.build(spec, dims=tiny_dims, activation=activation)
        x = torch.randn(2, 3, tiny_dims.d_model)  # (B, T, D)
        assert layer(x).shape == x.shape


@pytest.mark.parametrize("name", sorted(p.stem for p in FFN_DIR.glob("*.yaml")))
def test_changing_a_future_token_leaves_the_past_unchanged(name, tiny_dims):
    """The causal-leak test, in eval mode (no capacity dropping)."""
    torch.manual_seed(6)
    model = _model(_yaml(name), tiny_dims).eval()
    tokens = torch.randint(0, 256, (2, tiny_dims.seq_len))  # (B, T)
    t = tiny_dims.seq_len // 2
    changed = tokens.clone()
    changed[:, t + 1] = (changed[:, t + 1] + 1) % 256
    with torch.no_grad():
        before, after = model(tokens), model(changed)  # (B, T, V) each
    # regrouping tokens per expert reorders float sums: equal up to rounding, not bitwise
    torch.testing.assert_close(before[:, :t + 1], after[:, :t + 1], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(before[:, t + 1:], after[:, t + 1:])


@pytest.mark.parametrize("name", sorted(p.stem for p in FFN_DIR.glob("*.yaml")))
def test_tiny_model_forward_backward(name, tiny_dims):
    torch.manual_seed(7)
    model = _model(_yaml(name), tiny_dims).train()
    tokens = torch.randint(0, 256, (2, tiny_dims.seq_len))  # (B, T)
    loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
    aux = model.auxiliary_loss()
    assert (aux is None) == (name not in ROUTED)
    (loss if aux is None else loss + aux).backward()
    grads = dict(model.blocks[0].feedforward.named_parameters())
    # Every parameter joins the graph, even an expert that got no token (DDP needs it).
    for param_name, p in grads.items():
        assert p.grad is not None and torch.isfinite(p.grad).all(), param_name
    moved = {n for n, p in grads.items() if p.grad.abs().sum() > 0}
    assert {n for n in grads if not n.startswith("experts.")} <= moved
    used_experts = {n.split(".")[1] for n in moved if n.startswith("experts.")}
    assert len(used_experts) >= ROUTED.get(name, 0)


@pytest.mark.parametrize("name", sorted(ROUTED))
def test_the_fixed_slot_dispatch_equals_the_per_expert_one_with_gradients(name, tiny_dims):
    """Training's fixed-shape buffers (no host sync) against evaluation's per-expert groups,
    at the same routing with drops: outputs and every gradient."""
    torch.manual_seed(2)
    layer = _routed(name, tiny_dims, capacity_factor=0.75).train()
    x = torch.randn(24, tiny_dims.d_model)  # (N, D)
    probs = torch.softmax(x @ layer.router.weight.T, -1)
    capacity = layer.capacity(len(x))
    routed = route(probs, layer.top_k, capacity)
    assert not routed.kept.all()  # some assignments dropped
    results = []
    for dispatch in (lambda: layer.dispatch_to_slots(x, routed, capacity),
                     lambda: layer.dispatch(x, routed)):
        layer.zero_grad()
        y = dispatch()
        y.square().sum().backward(retain_graph=True)
        results.append((y.detach(), [p.grad.clone() for p in layer.experts.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-6, rtol=1e-5)
    for slots, groups in zip(results[0][1], results[1][1]):
        torch.testing.assert_close(slots, groups, atol=1e-6, rtol=1e-5)
