"""The recurrent mixers' short causal depth-wise convolution (shifted multiply-adds) equals
``F.conv1d(groups=C)`` over the same padded inputs, forward and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from xformer_bench.attention._ops.short_conv import causal_depthwise


@pytest.mark.parametrize("width,with_bias", [(4, True), (4, False), (1, True), (3, False)])
def test_shifted_sums_equal_the_depthwise_convolution(width, with_bias):
    g = torch.Generator().manual_seed(width)
    inputs = torch.randn(2, 9 + width - 1, 5, generator=g, requires_grad=True)
    weight = torch.randn(5, width, generator=g, requires_grad=True)
    bias = torch.randn(5, generator=g, requires_grad=True) if with_bias else None
    reference = F.conv1d(inputs.transpose(1, 2), weight[:, None], bias, groups=5).transpose(1, 2)
    ours = causal_depthwise(inputs, weight, bias)
    torch.testing.assert_close(ours, reference)
    leaves = [x for x in (inputs, weight, bias) if x is not None]
    cotangent = torch.randn(reference.shape, generator=g)
    expected = torch.autograd.grad(reference, leaves, cotangent)
    torch.testing.assert_close(torch.autograd.grad(ours, leaves, cotangent), expected)
    planted = causal_depthwise(inputs, weight.flip(-1), bias)  # taps the wrong way round
    assert width == 1 or not torch.allclose(planted, reference)
