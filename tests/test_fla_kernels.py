"""When the recurrent mixers hand their sums to fla: the switch, and fla's refusal of the
per-position gates' backward on Hopper with Triton 3.4.0-3.7.0 (fla issue #640, met on an H200)."""

import types
import warnings

import pytest
import torch

from xformer_bench.attention._ops import fla_kernels
from xformer_bench.attention._ops.fla_kernels import gated_backward_refused, use_fla


@pytest.mark.parametrize("capability, triton, tilelang, refused", [
    ((9, 0), "3.6.0", False, True),          # the H200 of this project's GPU runs
    ((9, 0), "3.4.0", False, True),
    ((9, 0), "3.7.0+git1234", False, True),
    ((9, 0), "3.3.1", False, False),         # before the bug
    ((9, 0), "3.7.1", False, False),         # fixed
    ((9, 0), "3.6.0", True, False),          # tilelang's kernels instead
    ((8, 0), "3.6.0", False, False),         # an A100
    ((10, 0), "3.6.0", False, False),        # Blackwell
])
def test_gated_backward_is_refused_exactly_where_fla_refuses_it(capability, triton, tilelang,
                                                                refused):
    assert gated_backward_refused(capability, triton, tilelang) is refused


@pytest.fixture
def fake_gpu(monkeypatch):
    """A CUDA-looking tensor, fla importable, and the refusing Hopper + Triton 3.6 pair."""
    monkeypatch.setattr(fla_kernels, "fla_available", lambda: True)
    monkeypatch.setattr(fla_kernels, "_gated_backward_refused_here", lambda: True)
    monkeypatch.delenv("XBENCH_FLA", raising=False)
    fla_kernels._say_once.cache_clear()
    return types.SimpleNamespace(is_cuda=True)


def test_fla_runs_on_cuda_only_and_xbench_fla_0_turns_it_off(fake_gpu, monkeypatch):
    assert use_fla(fake_gpu) and not use_fla(torch.zeros(1))
    monkeypatch.setenv("XBENCH_FLA", "0")
    assert not use_fla(fake_gpu)


def test_a_refused_gated_backward_takes_the_pytorch_form_and_says_so_once(fake_gpu):
    with pytest.warns(UserWarning, match="fla issue #640"):
        assert not use_fla(fake_gpu, gated=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not use_fla(fake_gpu, gated=True)  # said once only
        assert use_fla(fake_gpu)  # fixed decays (RetNet) and vector gates (GLA) keep fla
        with torch.no_grad():  # no backward: fla's forward is right there
            assert use_fla(fake_gpu, gated=True)
