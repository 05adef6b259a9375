"""Generic tests over the whole `attention` registry (every YAML of conf/attention/, at its
paper defaults): batch independence, finite gradients, no NaN on a fully padded row, and the
allocation test -- an option whose paper claims sub-quadratic cost never allocates a tensor
with T^2 elements per (batch, head), forward or backward, at T = 2048.  Causality of every
option with every position is in test_attention.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from xformer_bench.config import CONF_DIR
from xformer_bench.models.context import ForwardContext
from xformer_bench.models.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position

OPTIONS = sorted(p.stem for p in (Path(CONF_DIR) / "attention").glob("*.yaml"))


def mixer(name: str, seq_len: int, d_model: int = 32, n_heads: int = 2):
    spec = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "attention" / f"{name}.yaml"))
    dims = ModelDims(d_model=d_model, n_heads=n_heads, n_layers=2, d_ff=64, seq_len=seq_len,
                     vocab_size=256)
    torch.manual_seed(0)
    return build_token_mixer(spec, dims)


def contexts(layer) -> list[ForwardContext]:
    return [ForwardContext(Position(), causal=causal, layer=1)
            for causal in (True, False) if ("causal" if causal else "bidirectional") in layer.provides]


@pytest.mark.parametrize("name", OPTIONS)
def test_batch_rows_are_independent_and_gradients_finite(name):
    layer = mixer(name, seq_len=64)
    for ctx in contexts(layer):
        x = torch.randn(3, 64, 32, requires_grad=True)  # (B, T, D)
        out = layer.eval()(x, ctx)
        changed = x.detach().clone()
        changed[1:] = torch.randn(2, 64, 32)
        torch.testing.assert_close(layer(changed, ctx)[0], out[0].detach(), atol=1e-5, rtol=1e-5)
        layer.train()(x, ctx).square().mean().backward()
        assert torch.isfinite(x.grad).all()
        assert all(torch.isfinite(p.grad).all() for p in layer.parameters() if p.grad is not None)


@pytest.mark.parametrize("name", OPTIONS)
def test_a_fully_padded_row_gives_no_nan(name):
    layer = mixer(name, seq_len=32)
    if "key_padding_mask" not in layer.provides:
        pytest.skip(f"attention={name} declares no key padding mask")
    for ctx in contexts(layer):
        ctx.key_padding_mask = torch.zeros(2, 32, dtype=torch.bool)
        ctx.key_padding_mask[1] = True  # every key of the second sequence
        x = torch.randn(2, 32, 32, requires_grad=True)
        out = layer(x, ctx)
        assert torch.isfinite(out).all()
        out.sum().backward()
        assert torch.isfinite(x.grad).all()


class LargestAllocation(TorchDispatchMode):
    """Records the element count of every tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.largest, self.op = 0, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor) and leaf.numel() > self.largest:
                self.largest, self.op = leaf.numel(), func
        return out


def largest_allocation(layer, x, ctx) -> LargestAllocation:
    with LargestAllocation() as recorder:
        layer(x, ctx).sum().backward()
    return recorder


def test_the_allocation_recorder_sees_a_materialised_attention_matrix():
    t = 256
    q = torch.randn(1, 2, t, 16, requires_grad=True)
    with LargestAllocation() as recorder:
        ((q @ q.transpose(-1, -2)).softmax(-1) @ q).sum().backward()
    assert recorder.largest >= 2 * t * t


@pytest.mark.parametrize("name", OPTIONS)
def test_no_sub_quadratic_option_allocates_t_squared(name):
    t, batch = 2048, 1
    layer = mixer(name, seq_len=t, d_model=64, n_heads=2)
    if not layer.sub_quadratic:
        pytest.skip(f"attention={name} does not claim sub-quadratic cost")
    for ctx in contexts(layer):
        x = torch.randn(batch, t, 64, requires_grad=True)
        recorder = largest_allocation(layer, x, ctx)
        per_head = recorder.largest / (batch * 2)
        assert per_head < t * t, f"{recorder.op} allocated {recorder.largest} elements"
