"""The blocked kernels recompute their gathers in the backward pass
(:mod:`xformer_bench.attention._ops.recompute`): the same gradients, and a training step that
holds no more than full attention's (planted: the same kernels storing them hold more)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import compose_config
from tests.references import BOUNDARY_KWARGS, BOUNDARY_SEQ_LEN
from xformer_bench.models.build import build_model
from xformer_bench.training.step_memory import training_step_memory

RECOMPUTED = ("local", "block_local", "dilated", "strided")
AT_FULLS_MEMORY = ("local", "block_local", "dilated")
"""Those whose step, recomputed, holds about full attention's: within 10 % here (one layer's
gathered windows and their gradients at the backward's peak; 1.00-1.03x at the benchmark's
d_model 256, the README's table).  The others' forward still builds more at its peak."""


def _kernels(model):
    return [m.kernel for m in model.modules() if isinstance(getattr(m, "kernel", None),
                                                           torch.nn.Module)]


def _model(attention: str, *overrides: str, seq_len: int, d_model: int = 64):
    config = compose_config(f"attention={attention}", f"model.d_model={d_model}",
                            "model.n_layers=2", "model.n_heads=2", f"model.d_ff={2 * d_model}",
                            f"data.seq_len={seq_len}", "data.batch_size=1", *overrides)
    torch.manual_seed(0)
    model = build_model(config, vocab_size=256)
    for kernel in _kernels(model):
        kernel.fused_on_cpu = False  # the windowed path, which recomputes (the fused one stores
    return model                     # nothing to recompute: tests/test_attention_fused.py)


def _store(model, stored: bool) -> None:
    for kernel in _kernels(model):
        kernel.recompute_in_backward = not stored


@pytest.mark.parametrize("name", RECOMPUTED)
def test_recomputing_gives_the_stored_gradients(name):
    overrides = [f"attention.{k}={v}" for k, v in BOUNDARY_KWARGS[name].items()]
    model = _model(name, *overrides, seq_len=BOUNDARY_SEQ_LEN, d_model=32)
    tokens = torch.randint(0, 256, (2, BOUNDARY_SEQ_LEN), generator=torch.Generator().manual_seed(1))
    grads = []
    for stored in (True, False):
        _store(model, stored)
        model.zero_grad()
        model(tokens).float().mean().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for stored, recomputed in zip(*grads):
        torch.testing.assert_close(recomputed, stored, rtol=1e-5, atol=1e-6)


SIZES = {"local": ["attention.window=64"],
         "block_local": ["attention.block=64", "attention.memory=64"],
         "dilated": ["attention.window=32"],
         "strided": ["attention.stride=32"]}
"""Each option sparse at 1024 positions (a few percent of the causal pairs)."""


@pytest.mark.parametrize("name", RECOMPUTED)
def test_a_recomputed_step_holds_less_than_a_stored_one(name):
    """And for AT_FULLS_MEMORY, no more than full attention's (planted: the same kernel keeping
    its gathered windows for the backward pass holds more)."""
    seq_len = 1024
    model = _model(name, *SIZES[name], seq_len=seq_len)
    recomputed = training_step_memory(model, seq_len, 1, 256)
    _store(model, True)
    stored = training_step_memory(model, seq_len, 1, 256)
    assert recomputed < 0.9 * stored, (recomputed, stored)
    if name in AT_FULLS_MEMORY:
        full = training_step_memory(_model("full", seq_len=seq_len), seq_len, 1, 256)
        assert recomputed <= 1.1 * full < stored, (recomputed, full, stored)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_kernel_is_recomputed_once_whether_or_not_its_block_is(monkeypatch, checkpointing):
    """Each layer's kernel runs twice a step: its forward and one recomputation -- its own, or
    its block's under model.checkpointing (not both: that would be three)."""
    import xformer_bench.attention.local as local

    calls = []
    inner = local.windowed_attention
    monkeypatch.setattr(local, "windowed_attention",
                        lambda *a, **k: calls.append(1) or inner(*a, **k))
    model = _model("local", "attention.window=4", f"model.checkpointing={checkpointing}",
                   seq_len=BOUNDARY_SEQ_LEN, d_model=32)
    model(torch.randint(0, 256, (1, BOUNDARY_SEQ_LEN))).float().mean().backward()
    assert len(calls) == 2 * 2  # two layers


@pytest.mark.parametrize("name", [n for n in RECOMPUTED if n != "strided"])
def test_a_compiled_kernel_is_one_graph_with_gradients_on(name):
    """Under torch.compile the kernel is not checkpointed (a checkpoint breaks the graph):
    fullgraph=True compiles its windowed forward with gradients enabled (strided's general
    path is the factorised layout, which breaks as axial's; its fused path compiles whole,
    tests/test_compile.py)."""
    overrides = [f"attention.{k}={v}" for k, v in BOUNDARY_KWARGS[name].items()]
    model = _model(name, *overrides, seq_len=BOUNDARY_SEQ_LEN, d_model=32)
    kernel = _kernels(model)[0]
    q, k, v = (torch.randn(1, 2, BOUNDARY_SEQ_LEN, 16, requires_grad=True) for _ in range(3))
    torch._dynamo.reset()
    compiled = torch.compile(lambda q, k, v: kernel(q, k, v, causal=True), fullgraph=True,
                             backend="eager")
    torch.testing.assert_close(compiled(q, k, v), kernel(q, k, v, causal=True))
