"""Hyena and S4D configured as their papers' code: hyena's positions scaled to the training
length, its filter FFN initialised N(0, 0.02) (safari's ``_init_weights``) and kept out of weight
decay (safari's ``HyenaFilter._optim``); a causal S4D holding no anticausal C it never trains;
and state bytes true to the state tensors' dtype (S4D's complex64: 8 bytes an element)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import compose_config
from xformer_bench.attention.hyena import FILTER_INIT_STD
from xformer_bench.attention.s4d import S4D
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.decode_cache import DecodeCache
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.build import build_model
from xformer_bench.models.state_size import mixer_state_bytes
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position
from xformer_bench.tasks.optimization import adamw_with_schedule

TINY = ("model.d_model=32", "model.n_heads=2", "model.n_layers=2", "model.d_ff=64")


def model(attention: str, *overrides: str, seq_len: int = 16, sizes=TINY):
    config = compose_config(f"attention={attention}", f"data.seq_len={seq_len}", *sizes,
                            *overrides)
    torch.manual_seed(0)
    return build_model(config, vocab_size=64), config


def mixers(built: nn.Module) -> list[nn.Module]:
    return [block.attention for block in built.stack.blocks]


def dims(d_model: int = 16, seq_len: int = 16) -> ModelDims:
    return ModelDims(d_model=d_model, n_heads=2, n_layers=2, d_ff=32, seq_len=seq_len,
                     vocab_size=64)


# ------------------------------------------------------------------ hyena


@pytest.mark.parametrize("seq_len", [64, 2048])
def test_hyena_positions_span_zero_to_one_at_the_training_length(seq_len):
    built, config = model("hyena", seq_len=seq_len)
    assert config["attention"]["position_scale"] is None  # the training length
    assert mixers(built)[0].filter.scale == seq_len
    t = mixers(built)[0].filter.times(torch.arange(seq_len, dtype=torch.float32))
    assert t[0] == 0 and t[-1] == 1 and bool((t.diff() > 0).all())
    fixed = torch.arange(seq_len, dtype=torch.float32) / (2048 - 1)  # the old position_scale
    assert seq_len == 2048 or fixed[-1] < 0.05


def test_hyena_position_scale_override_and_lengths_past_it():
    built, _ = model("hyena", "attention.position_scale=256", seq_len=64)
    filt = mixers(built)[0].filter
    assert filt.scale == 256 and filt.times(torch.tensor([255.0])) == 1
    hand = build_token_mixer({"name": "hyena"}, dims(seq_len=32))  # None: dims.seq_len
    assert hand.filter.scale == 32
    taps = hand.filter(80)  # 2.5 x the training length: t up to 79 / 31
    assert taps.shape == (16, 80) and bool(taps.isfinite().all())
    torch.testing.assert_close(taps[:, 50:], hand.filter(30, start=50))


def test_hyena_filter_ffn_is_initialised_as_safari():
    built, _ = model("hyena", sizes=("model.d_model=128", "model.n_heads=4", "model.n_layers=2",
                                     "model.d_ff=256"))
    for mixer in mixers(built):  # after the model-wide initialisation
        layers = mixer.filter.layers
        weights = torch.cat([layer.weight.flatten() for layer in layers])  # 19,520 draws
        assert abs(weights.std().item() / FILTER_INIT_STD - 1) < 0.05
        assert abs(weights.mean().item()) < 0.002
        assert all(bool((layer.bias == 0).all()) for layer in layers[:-1])
        assert layers[-1].bias is None
        torch.testing.assert_close(mixer.filter.freq, torch.full((64,), 14.0))


def test_hyena_filter_parameters_are_not_decayed_and_matrices_are():
    built, config = model("hyena")
    optimizer = adamw_with_schedule(built, config["optim"], 10)["optimizer"]
    decay = {id(p): g["weight_decay"] for g in optimizer.param_groups for p in g["params"]}
    assert config["optim"]["weight_decay"] > 0
    for mixer in mixers(built):
        assert all(decay[id(p)] == 0.0 for p in mixer.filter.parameters())
        assert decay[id(mixer.filter.layers[1].weight)] == 0.0  # a matrix, marked
        assert decay[id(mixer.in_proj.weight)] == decay[id(mixer.out.weight)] > 0
    assert decay[id(built.stack.blocks[0].feedforward.parameters().__next__())] > 0


def test_a_marked_matrix_is_not_decayed():
    module = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    module[1].weight._no_weight_decay = True
    optim = {"lr": 1e-3, "betas": [0.9, 0.98], "eps": 1e-8, "weight_decay": 0.1,
             "warmup_steps": 0, "decay": "constant", "min_lr_ratio": 0.0}
    groups = adamw_with_schedule(module, optim, 10)["optimizer"].param_groups
    assert [len(g["params"]) for g in groups] == [1, 3]
    assert groups[0]["params"][0] is module[0].weight and groups[0]["weight_decay"] == 0.1


# ------------------------------------------------------------------ s4d


def grads_after_backward(mixer: nn.Module, causal: bool) -> dict[str, torch.Tensor | None]:
    torch.manual_seed(1)
    x = torch.randn(2, 12, mixer.channels)
    mixer(x, ForwardContext(Position(), causal=causal)).square().sum().backward()
    return {n: p.grad for n, p in mixer.named_parameters()}


def test_a_causal_s4d_trains_every_parameter():
    torch.manual_seed(0)
    both = build_token_mixer({"name": "s4d", "d_state": 8}, dims())
    c = grads_after_backward(both, causal=True)["c"]  # the old layer: half of C never trains
    assert bool((c[: c.numel() // 2] != 0).any()) and bool((c[c.numel() // 2:] == 0).all())
    torch.manual_seed(0)
    causal = build_token_mixer({"name": "s4d", "d_state": 8}, dims())
    causal.specialise(causal=True)
    for name, grad in grads_after_backward(causal, causal=True).items():
        assert grad is not None and bool((grad != 0).any()), name
    torch.testing.assert_close(causal.c, both.c[: both.c.numel() // 2])  # the same draws


def test_a_causal_s4d_drops_exactly_the_anticausal_c():
    """d_model 128, d_state 64: H x N/2 complex = 8,192 real parameters a layer."""
    both = build_token_mixer({"name": "s4d"}, dims(d_model=128))
    causal = build_token_mixer({"name": "s4d"}, dims(d_model=128))
    causal.specialise(causal=True)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    assert count(both) - count(causal) == 128 * 32 * 2 == 8192
    assert "bidirectional" not in causal.provides and "bidirectional" in S4D.provides
    with pytest.raises(ValueError, match="causal model"):
        causal(torch.randn(1, 4, 128), ForwardContext(Position(), causal=False))
    both.specialise(causal=False)  # an encoder keeps both directions
    assert count(both) == count(causal) + 8192
    assert all(g is not None for g in grads_after_backward(both, causal=False).values())


def test_a_causal_lm_with_s4d_trains_every_parameter():
    sizes = ("model.d_model=128", "model.n_heads=4", "model.n_layers=4", "model.d_ff=64")
    built, _ = model("s4d", sizes=sizes)
    assert all(m.directions == 1 for m in mixers(built))
    logits = built(torch.randint(0, 64, (2, 16)))
    logits.float().square().mean().backward()
    dead = [n for n, p in built.named_parameters() if p.grad is None or not (p.grad != 0).any()]
    assert dead == []


# ------------------------------------------------------------------ state bytes


def decoded_state(mixer: nn.Module, d_model: int, steps: int = 3) -> list[torch.Tensor]:
    cache = DecodeCache()
    with torch.no_grad():
        for _ in range(steps):
            cache.begin_step(1)
            mixer(torch.randn(1, 1, d_model), ForwardContext(Position(), causal=True,
                                                              cache=cache))
    found: list[torch.Tensor] = []

    def walk(value):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    walk(cache.slots)
    return found


def test_s4d_state_bytes_are_the_complex_state_it_decodes_with():
    mixer = build_token_mixer({"name": "s4d"}, dims(d_model=32)).eval()
    state = decoded_state(mixer, 32)
    assert [s.dtype for s in state] == [torch.complex64]
    carried = sum(s.numel() * s.element_size() for s in state)
    assert carried == 32 * 32 * 8  # H x N/2 modes x complex64
    assert mixer_state_bytes(mixer, 100, 32) == carried  # was half: 4 bytes an element
    assert mixer_state_bytes(mixer, 100, 32, dtype=torch.bfloat16) == carried
    assert mixer_state_bytes(mixer, 100, 32, batch=2) == 2 * carried


@pytest.mark.parametrize("name", ["retnet", "gla"])
def test_a_real_valued_mixers_state_bytes_are_unchanged(name):
    mixer = build_token_mixer({"name": name}, dims(d_model=32)).eval()
    state = decoded_state(mixer, 32)
    assert state and all(s.dtype == torch.float32 for s in state)
    elements = sum(s.numel() for s in state)
    assert mixer_state_bytes(mixer, 100, 32) == 4 * elements
    assert mixer_state_bytes(mixer, 100, 32, dtype=torch.bfloat16) == 2 * elements
