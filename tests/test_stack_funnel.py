"""stack=funnel: shortening between stages (Funnel-Transformer; causal with the Hourglass's
shift)."""

from __future__ import annotations

import pytest
import torch

from conftest import compose_config
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.context import ForwardContext
from xformer_bench.position import Position

SMALL = ("stack=funnel", "model.d_model=16", "model.n_heads=2", "model.n_layers=4",
         "model.d_ff=32", "data.seq_len=32")


def _model(*overrides: str):
    torch.manual_seed(0)
    return build_model(compose_config(*SMALL, *overrides), 32).eval()


@pytest.mark.parametrize("overrides", [(), ("stack.pooling=mean",), ("stack.upsampling=linear",),
                                       ("stack.factor=4", "stack.layers=[1,1,2]")])
def test_the_hourglass_never_reads_the_future(overrides):
    model = _model(*overrides)
    tokens = torch.randint(0, 32, (2, 31))  # not a multiple of the factor
    for t in (0, 1, 2, 3, 7, 30):
        changed = tokens.clone()
        changed[:, t + 1:] = (changed[:, t + 1:] + 1) % 32
        torch.testing.assert_close(model(tokens)[:, :t + 1], model(changed)[:, :t + 1])


def test_shortening_groups_k_positions_and_the_shift_ends_a_group_at_its_last_input():
    stack = _model("stack.pooling=mean").stack
    h = torch.arange(9.0).view(1, 9, 1).expand(1, 9, 16)
    causal = stack.shorten(h, causal=True)[0, :, 0]  # groups of shifted [0,0,0,1,..]
    torch.testing.assert_close(causal, torch.tensor([0.0, 2.0, 5.0]))  # means of [_,_,0],[1..3],[4..6]
    both = stack.shorten(h, causal=False)[0, :, 0]
    torch.testing.assert_close(both, torch.tensor([1.0, 4.0, 7.0]))
    up = stack.upsample(torch.tensor([[[1.0], [2.0], [3.0]]]), 8)[0, :, 0]
    torch.testing.assert_close(up, torch.tensor([1.0, 1, 1, 2, 2, 2, 3, 3]))


def test_bidirectional_use_sees_the_future_and_keeps_the_length():
    stack = _model().stack
    x = torch.randn(1, 10, 16)
    ctx = ForwardContext(Position(), causal=False)
    y = stack(x, ctx)
    changed = x.clone()
    changed[:, -1] += 1.0
    assert y.shape == x.shape and not torch.allclose(stack(changed, ctx)[:, 0], y[:, 0])


def test_stage_sizes_and_refusals():
    assert _model().stack.sizes == (1, 2, 1)
    with pytest.raises(ConfigError, match=r"stack.layers=\[1, 1, 1\] sums to 3, model.n_layers=4"):
        _model("stack.layers=[1,1,1]")
    assert len(_model("model.share_blocks=true").stack.blocks) == 1
    with pytest.raises(ConfigError, match="model.residual_attention=true needs blocks applied"):
        _model("model.residual_attention=true")
