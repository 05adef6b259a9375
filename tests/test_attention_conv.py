"""Convolutional token mixers: ``lightweight_conv`` and ``dynamic_conv`` (Wu et al.
2019) against loops written from the paper's definitions, and ``lsra`` (Lite Transformer, Wu et
al. 2020) against attention and the convolution computed by hand on its two halves; causality,
padding, weight sharing, softmax-normalised kernels, per-layer widths and the option errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from references import masked_softmax_attention
from xformer_bench.attention._ops.conv import dynamic_kernel_conv
from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position

OPTIONS = ("lightweight_conv", "dynamic_conv", "lsra")


def build(name: str, d_model: int = 16, n_heads: int = 2, seq_len: int = 12, **options):
    dims = ModelDims(d_model=d_model, n_heads=n_heads, n_layers=2, d_ff=32, seq_len=seq_len,
                     vocab_size=256)
    torch.manual_seed(0)
    return build_token_mixer({"name": name, **options}, dims).eval()


def context(causal: bool = True, layer: int = 0, padding: torch.Tensor | None = None):
    return ForwardContext(Position(), causal=causal, layer=layer, key_padding_mask=padding)


def reference_conv(g: torch.Tensor, kernels, causal: bool) -> torch.Tensor:
    """The paper's DepthwiseConv, one output at a time: out[b, i, c] = sum_j K[j] g[b, i+j-left, c]
    with K = kernels(b, i, head of c), a (k,) tensor; positions outside the sequence are zero."""
    b_size, t_size, d = g.shape
    out = torch.zeros_like(g)
    for b in range(b_size):
        for i in range(t_size):
            for c in range(d):
                kernel = kernels(b, i, c)
                k = kernel.shape[0]
                left = k - 1 if causal else (k - 1) // 2
                for j in range(k):
                    s = i + j - left
                    if 0 <= s < t_size:
                        out[b, i, c] += kernel[j] * g[b, s, c]
    return out


def glu_input(branch, x: torch.Tensor) -> torch.Tensor:
    """G = GLU(x W^I): first half times sigmoid of the second, written out."""
    a, gate = (x @ branch.up.weight.T + branch.up.bias).chunk(2, dim=-1)
    return a * torch.sigmoid(gate)


def softmax(v: torch.Tensor) -> torch.Tensor:
    e = torch.exp(v - v.max())
    return e / e.sum()


# --- lightweight convolution -------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_lightweight_conv_equals_the_papers_definition(causal):
    layer = build("lightweight_conv", kernel_size=3)
    with torch.no_grad():
        layer.branch.conv.weight.normal_()  # kernels far from uniform
    x = torch.randn(2, 7, 16)
    heads, per_head = 2, 8
    weight = layer.branch.conv.weight.detach()  # (H, k)
    g = glu_input(layer.branch, x)
    conv = reference_conv(g, lambda b, i, c: softmax(weight[c // per_head]), causal)
    expected = conv @ layer.out.weight.T + layer.out.bias
    assert weight.shape == (heads, 3)
    torch.testing.assert_close(layer(x, context(causal)), expected.detach(), atol=1e-5, rtol=1e-5)


def test_lightweight_conv_shares_one_kernel_per_head():
    layer = build("lightweight_conv", d_model=32, n_heads=4, kernel_size=5)
    conv_params = dict(layer.branch.conv.named_parameters())
    assert list(conv_params) == ["weight"]
    assert conv_params["weight"].numel() == 4 * 5  # H k, not D k
    total = sum(p.numel() for p in layer.parameters())
    assert total == (32 * 64 + 64) + 4 * 5 + (32 * 32 + 32)  # W^I, kernels, W^O
    # the channels of one head see the same kernel: equal inputs on two channels of head 0
    # give equal outputs on them, a channel of head 1 with the same input does not
    g = torch.randn(1, 9, 1).expand(1, 9, 32).contiguous()
    out = layer.branch.conv(g, causal=True)
    torch.testing.assert_close(out[..., 0], out[..., 7])
    assert not torch.allclose(out[..., 0], out[..., 8])


@pytest.mark.parametrize("causal", [True, False])
def test_the_kernel_of_every_head_is_softmax_normalised(causal):
    layer = build("lightweight_conv", d_model=32, n_heads=4, kernel_size=5)
    with torch.no_grad():
        layer.branch.conv.weight.mul_(10).add_(3)  # logits far from normalised
    kernel = layer.branch.conv.kernel(causal=causal)
    assert kernel.shape == (4, 5) and (kernel > 0).all()
    torch.testing.assert_close(kernel.sum(-1), torch.ones(4))
    # a constant input: every output whose window lies inside the sequence is that constant
    ones = torch.ones(2, 12, 32)
    out = layer.branch.conv(ones, causal=causal)
    inside = slice(4, None) if causal else slice(2, -2)
    torch.testing.assert_close(out[:, inside], ones[:, inside])
    dynamic = build("dynamic_conv", d_model=32, n_heads=4, kernel_size=5)
    kernels = dynamic.branch.conv.kernels(torch.randn(2, 12, 32) * 5, causal=causal)
    torch.testing.assert_close(kernels.sum(-1), torch.ones(2, 12, 4))


def test_weight_dropout_drops_kernel_entries_in_training_only():
    layer = build("lightweight_conv", kernel_size=31, weight_dropout=0.5)
    assert (layer.branch.conv.kernel(causal=True) > 0).all()  # eval: no DropConnect
    dropped = layer.train().branch.conv.kernel(causal=True)
    assert (dropped == 0).any() and (dropped > 0).any()


def test_bidirectional_lightweight_conv_sees_the_future_and_causal_does_not():
    layer = build("lightweight_conv", kernel_size=5)
    x = torch.randn(1, 10, 16)
    changed = x.clone()
    changed[:, 6] += 1.0
    causal_before, causal_after = layer(x, context(True)), layer(changed, context(True))
    torch.testing.assert_close(causal_before[:, :6], causal_after[:, :6])
    both_before, both_after = layer(x, context(False)), layer(changed, context(False))
    assert not torch.allclose(both_before[:, 4:6], both_after[:, 4:6])  # within (k-1)/2 = 2 ahead
    torch.testing.assert_close(both_before[:, :4], both_after[:, :4])  # beyond the kernel's reach


# --- dynamic convolution -----------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_dynamic_conv_equals_the_papers_definition(causal):
    layer = build("dynamic_conv", kernel_size=3)
    x = torch.randn(2, 7, 16)
    per_head, k = 8, 3
    g = glu_input(layer.branch, x)
    w_q = layer.branch.conv.weight_linear.weight  # (H k, d): f(G_i) = W^Q G_i, no bias
    assert layer.branch.conv.weight_linear.bias is None and w_q.shape == (2 * k, 16)

    def kernel(b, i, c):
        logits = (w_q @ g[b, i]).view(2, k)  # (H, k)
        return softmax(logits[c // per_head])

    expected = reference_conv(g, kernel, causal) @ layer.out.weight.T + layer.out.bias
    torch.testing.assert_close(layer(x, context(causal)), expected.detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("t", "k"), [(7, 3), (70, 5), (4, 9), (45, 35)])
def test_the_banded_dynamic_conv_is_the_sum_over_taps_with_its_gradients(causal, t, k):
    """Blocks of max(k, 32) positions, the last partial, a sequence shorter than the kernel:
    the banded matmul equals sum_j K[..., j] G[i + j - left], tap by tap, in float64."""
    g = torch.randn(2, t, 8, dtype=torch.float64, requires_grad=True)
    kernels = torch.randn(2, t, 2, k, dtype=torch.float64).softmax(-1).requires_grad_()
    left = k - 1 if causal else (k - 1) // 2
    padded = F.pad(g, (0, 0, left, k - 1 - left)).view(2, t + k - 1, 2, 4)  # (B, T+k-1, H, C/H)
    taps = sum(padded[:, j:j + t] * kernels[..., j, None] for j in range(k)).reshape(2, t, 8)
    out = dynamic_kernel_conv(g, kernels, causal=causal)
    cotangent = torch.randn_like(out)
    torch.testing.assert_close(out, taps)
    torch.testing.assert_close(torch.autograd.grad(out, (g, kernels), cotangent),
                               torch.autograd.grad(taps, (g, kernels), cotangent))


def test_dynamic_conv_runs_at_t_2048():
    layer = build("dynamic_conv", d_model=16, n_heads=2, seq_len=2048)
    x = torch.randn(1, 2048, 16, requires_grad=True)
    out = layer(x, context(True))
    assert out.shape == (1, 2048, 16)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


# --- all three ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPTIONS)
def test_changing_the_future_leaves_the_past_unchanged(name):
    layer = build(name, kernel_size=5)
    x = torch.randn(2, 12, 16)
    for t in (0, 5, 10):
        changed = x.clone()
        changed[:, t + 1:] = torch.randn(2, 11 - t, 16)
        before, after = layer(x, context(True)), layer(changed, context(True))
        torch.testing.assert_close(before[:, : t + 1], after[:, : t + 1], atol=1e-6, rtol=1e-6)
        assert not torch.allclose(before[:, t + 1:], after[:, t + 1:])


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", OPTIONS)
def test_a_padded_position_changes_no_other_output(name, causal):
    layer = build(name, kernel_size=5)
    x = torch.randn(2, 10, 16)
    padding = torch.zeros(2, 10, dtype=torch.bool)
    padding[0, 3] = padding[0, 8:] = padding[1, 0] = True
    changed = x.clone()
    changed[padding] = torch.randn(int(padding.sum()), 16) * 10
    before = layer(x, context(causal, padding=padding))
    after = layer(changed, context(causal, padding=padding))
    torch.testing.assert_close(before[~padding], after[~padding], atol=1e-5, rtol=1e-5)
    unmasked = layer(changed, context(causal))  # without the mask the padding is read
    assert not torch.allclose(before[~padding], unmasked[~padding], atol=1e-4)


@pytest.mark.parametrize("name", OPTIONS)
def test_no_queries_and_keys_for_positions_but_any_length(name):
    provides = build(name).provides
    assert {"causal", "bidirectional", "key_padding_mask", "variable_length"} <= provides
    assert not provides & {"queries_and_keys", "additive_bias"}
    assert build(name).sub_quadratic == (name != "lsra")
    layer = build(name, seq_len=8)
    assert layer(torch.randn(1, 20, 16), context(True)).shape == (1, 20, 16)  # longer than seq_len


@pytest.mark.parametrize("name", OPTIONS)
def test_per_layer_widths_follow_ctx_layer_and_keep_the_last(name):
    layer = build(name, kernel_sizes=[1, 3])
    x = torch.randn(1, 10, 16)

    def reach(layer_index: int) -> int:
        """How many positions back a change at position 5 is seen by the conv output."""
        changed = x.clone()
        changed[:, 5] += 1.0
        branch = layer.branch if name != "lsra" else layer.conv
        g, g_changed = (branch(v[..., -branch.up.in_features:], causal=True, layer=layer_index)
                        for v in (x, changed))
        moved = ~torch.isclose(g, g_changed, atol=1e-6).all(-1)[0]  # (T,)
        return int(moved.nonzero().max()) - 5

    assert reach(0) == 0  # width 1: softmax of one tap is 1, the identity
    assert reach(1) == 2 and reach(7) == 2  # width 3: t-2 .. t; deeper layers keep the last


# --- long-short range attention ----------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_lsra_is_attention_on_one_half_and_lightconv_on_the_other(causal):
    layer = build("lsra", d_model=16, n_heads=2, kernel_size=3)
    with torch.no_grad():
        layer.out.weight.copy_(torch.eye(16))  # read the concatenated branches directly
        layer.out.bias.zero_()
    x = torch.randn(2, 7, 16)
    out = layer(x, context(causal))
    # attention half: channels 0-7, 2 heads of 4, q/k/v from the half's own projection
    q, k, v = (x[..., :8] @ layer.qkv.weight.T + layer.qkv.bias).split(8, dim=-1)
    heads = lambda y: y.view(2, 7, 2, 4).transpose(1, 2)  # noqa: E731 -- (B, H, T, 4)
    attention = masked_softmax_attention(heads(q), heads(k), heads(v), causal=causal)
    torch.testing.assert_close(out[..., :8], attention.transpose(1, 2).reshape(2, 7, 8).detach(),
                               atol=1e-5, rtol=1e-5)
    # convolution half: channels 8-15 through GLU and a lightweight conv with 2 shared kernels
    weight = layer.conv.conv.weight.detach()  # (H, k)
    assert weight.shape == (2, 3)
    g = glu_input(layer.conv, x[..., 8:])
    conv = reference_conv(g, lambda b, i, c: softmax(weight[c // 4]), causal)
    torch.testing.assert_close(out[..., 8:], conv.detach(), atol=1e-5, rtol=1e-5)


def test_lsra_attention_honours_padding_and_a_dynamic_branch_is_an_option():
    layer = build("lsra", d_model=16, n_heads=2, conv="dynamic")
    assert type(layer.conv.conv).__name__ == "DynamicConv"
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, :2] = True
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        layer.out.weight.copy_(torch.eye(16))
        layer.out.bias.zero_()
    q, k, v = (x[..., :8] @ layer.qkv.weight.T + layer.qkv.bias).split(8, dim=-1)
    heads = lambda y: y.view(2, 7, 2, 4).transpose(1, 2)  # noqa: E731
    expected = masked_softmax_attention(heads(q), heads(k), heads(v), padding=padding)
    out = layer(x, context(False, padding=padding))[..., :8]
    torch.testing.assert_close(out, expected.transpose(1, 2).reshape(2, 7, 8).detach(),
                               atol=1e-5, rtol=1e-5)


# --- options -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPTIONS)
def test_an_even_kernel_is_causal_only(name):
    layer = build(name, kernel_size=4)
    assert "causal" in layer.provides and "bidirectional" not in layer.provides
    assert layer(torch.randn(1, 6, 16), context(True)).shape == (1, 6, 16)
    with pytest.raises(ConfigError, match=r"attention\.kernel_size=4 must be odd for bidi"):
        layer(torch.randn(1, 6, 16), context(False))
    layered = build(name, kernel_sizes=[3, 4])
    assert "bidirectional" not in layered.provides
    layered(torch.randn(1, 6, 16), context(False, layer=0))  # width 3 is fine
    with pytest.raises(ConfigError, match=r"attention\.kernel_sizes=\[3, 4\] must be odd"):
        layered(torch.randn(1, 6, 16), context(False, layer=1))


@pytest.mark.parametrize("name", OPTIONS)
@pytest.mark.parametrize("options, key", [
    ({"kernel_size": 0}, "attention.kernel_size=0"),
    ({"kernel_size": 2.5}, "attention.kernel_size=2.5"),
    ({"kernel_sizes": []}, r"attention.kernel_sizes=\[\]"),
    ({"kernel_sizes": [3, 0]}, r"attention.kernel_sizes=\[3, 0\]"),
    ({"weight_dropout": 1.0}, "attention.weight_dropout=1.0"),
])
def test_bad_options_are_one_line_config_errors_naming_the_key(name, options, key):
    with pytest.raises(ConfigError, match=key) as error:
        build(name, **options)
    assert "\n" not in str(error.value)


def test_lsra_refuses_widths_it_cannot_split():
    with pytest.raises(ConfigError, match="attention.conv='nope'"):
        build("lsra", conv="nope")
    with pytest.raises(ConfigError, match="model.d_model=12.*model.n_heads=4"):
        build("lsra", d_model=12, n_heads=4)  # d/2 = 6 heads of 1.5
