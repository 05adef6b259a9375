"""The fused CPU paths of the banded and factorised patterns (:mod:`xformer_bench.attention._ops.
key_set_union`: fused kernel calls merged by log-sum-exp): the same outputs and gradients as
each option's general path at lengths that cross every row, block, lane and window boundary,
and in bfloat16; the general path where the fused one does not apply; and a training step
within full attention's memory (planted: the general path storing its gathers or scores holds
more)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import compose_config
from xformer_bench.attention._ops.key_set_union import KeySetUnion
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.build import build_model
from xformer_bench.registry import ATTENTION
from xformer_bench.training.step_memory import training_step_memory

SETTINGS = {  # several per option: a window or stride that is and is not a row, c = l, auto
    "local": [{"window": 5}, {"window": 8}, {"window": 100}],
    "dilated": [{"window": 4, "dilation": 3}, {"window": 7, "dilation": 2}],
    "block_local": [{"block": 5, "memory": 7}, {"block": 8, "memory": 8},
                    {"block": 6, "memory": 3}, {"block": 4, "memory": 0}],
    "longformer": [{"window": 5, "n_global": 1}, {"window": 8, "n_global": 3},
                   {"window": 4, "n_global": 9}, {"window": 100, "n_global": 2}],
    "bigbird": [{"block": 3, "window_blocks": 3, "global_blocks": 1, "random_blocks": 2},
                {"block": 4, "window_blocks": 2, "global_blocks": 3, "random_blocks": 1},
                {"block": 5, "window_blocks": 1, "global_blocks": 0, "random_blocks": 3}],
    "fixed": [{"stride": 5, "summary": 2}, {"stride": 8, "summary": 8},
              {"stride": 32, "summary": 3}, {"stride": "auto", "summary": 4}],
    "strided": [{"stride": 5}, {"stride": 8}, {"stride": 32}, {"stride": "auto"}],
}
CASES = [(name, settings) for name, options in SETTINGS.items() for settings in options]
FUSED = tuple(SETTINGS)


def _kernel(name, fused=True, **settings):
    dims = ModelDims(d_model=32, n_heads=2, n_layers=2, d_ff=64, seq_len=64, vocab_size=256)
    kernel = ATTENTION.get(name)(dims, **settings)
    kernel.fused_on_cpu = fused
    return kernel


def _run(kernel, q, k, v, grad, **options):
    q, k, v = (x.detach().requires_grad_() for x in (q, k, v))
    out = kernel(q, k, v, **options)
    return (out, *torch.autograd.grad((out.float() * grad).sum(), (q, k, v)))


@pytest.mark.parametrize("name, settings", CASES)
@pytest.mark.parametrize("t", [8, 37, 70])
def test_the_fused_path_equals_the_general_one_with_gradients(name, settings, t):
    gen = torch.Generator().manual_seed(t)
    q, k, v, grad = (torch.randn(2, 2, t, 16, generator=gen) for _ in range(4))
    fused, general = (_run(_kernel(name, fused, **settings), q, k, v, grad, causal=True)
                      for fused in (True, False))
    for a, b in zip(fused, general):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_fixed_in_several_summary_chunks_equals_the_general_path(monkeypatch):
    """Chunks of 2 rows (the default's 512 queries are one chunk at these lengths)."""
    import xformer_bench.attention.fixed as fixed
    monkeypatch.setattr(fixed, "CHUNK_QUERIES", 10)
    fixed.summary_calls.cache_clear()
    try:
        test_the_fused_path_equals_the_general_one_with_gradients(
            "fixed", {"stride": 5, "summary": 2}, 67)
        assert sum(call.slot == 2 for call in fixed.summary_calls(14, 5, 2)) == 6
    finally:
        fixed.summary_calls.cache_clear()


@pytest.mark.parametrize("name", FUSED)
def test_the_fused_path_in_bfloat16_is_the_float32_answer_within_bf16(name):
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad = (torch.randn(1, 2, 48, 16, generator=gen) for _ in range(4))
    kernel = _kernel(name, **SETTINGS[name][0])
    wide = _run(kernel, q, k, v, grad, causal=True)
    narrow = _run(kernel, *(x.bfloat16() for x in (q, k, v)), grad, causal=True)
    for a, b in zip(narrow, wide):
        torch.testing.assert_close(a.float(), b, rtol=0.05, atol=0.05)


@pytest.mark.parametrize("name", FUSED)
def test_other_cases_take_the_general_path(name, monkeypatch):
    """Key padding, more keys than queries (a decode step), bidirectional where declared, and
    another mode: the fused call is never made (planted: the plain call makes it)."""
    kernel = _kernel(name, **SETTINGS[name][0])
    q = k = v = torch.randn(1, 2, 24, 16)
    kernel(q, k, v, causal=True)
    monkeypatch.setattr(KeySetUnion, "apply", lambda *a, **k: pytest.fail("fused path taken"))
    with pytest.raises(pytest.fail.Exception):
        kernel(q, k, v, causal=True)
    kernel(q, k, v, causal=True, key_padding_mask=torch.zeros(1, 24, dtype=torch.bool))
    if "longer_keys" in kernel.provides:
        kernel(q[:, :, -3:], k, v, causal=True)
    if "bidirectional" in kernel.provides:
        kernel(q, k, v, causal=False)
    if hasattr(kernel, "mode"):
        kernel.mode = "interleaved"
        kernel(q, k, v, causal=True)


SPARSE_AT_1024 = {"local": ["attention.window=64"],
                  "longformer": ["attention.window=64", "attention.n_global=4"],
                  "bigbird": ["attention.block=16", "attention.global_blocks=1"],
                  "dilated": ["attention.window=32"],
                  "block_local": ["attention.block=64", "attention.memory=64"],
                  "fixed": ["attention.stride=64", "attention.summary=16"],
                  "strided": ["attention.stride=32"]}


def _step_memory(attention: str, fused: bool = True) -> float:
    seq_len = 1024
    config = compose_config(f"attention={attention}", "model.d_model=64", "model.n_layers=2",
                            "model.n_heads=2", "model.d_ff=128", f"data.seq_len={seq_len}",
                            "data.batch_size=1", *SPARSE_AT_1024.get(attention, []))
    torch.manual_seed(0)
    model = build_model(config, vocab_size=256)
    for module in model.modules():
        if isinstance(module, tuple(ATTENTION.get(name) for name in FUSED)):
            module.fused_on_cpu = fused
            module.recompute_in_backward = False  # the general path storing its intermediates
    return training_step_memory(model, seq_len, 1, 256)


OVER_FULL = {"fixed": 1.05}
"""A fused step's memory over full attention's: none (1 %: the tracker's rounding), but fixed's
gathered summary columns (T c / l keys and values a layer, T / 8 here)."""


@pytest.mark.parametrize("name", FUSED)
def test_a_fused_step_holds_no_more_than_full_attentions(name):
    full, fused, general = _step_memory("full"), _step_memory(name), _step_memory(name, False)
    assert fused <= OVER_FULL.get(name, 1.01) * full < general, (fused, full, general)
