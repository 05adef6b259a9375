"""Attention-free token mixers: FNet's Fourier sublayer against torch.fft and an
explicit DFT-matrix product; MLP-Mixer's token-mixing MLP against hand-computed outputs and a
per-channel loop of eq. 1; gMLP's spatial gating unit against a per-position loop; causality,
lengths and padding of each."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from conftest import compose_config
from references import causal_mask
from xformer_bench.errors import ConfigError
from xformer_bench.models.build import build_model
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.token_mixer import build_token_mixer
from xformer_bench.position import Position

SEQ_LEN, D_MODEL = 12, 8


def build(name: str, seq_len: int = SEQ_LEN, **options):
    dims = ModelDims(d_model=D_MODEL, n_heads=2, n_layers=2, d_ff=16, seq_len=seq_len,
                     vocab_size=256)
    torch.manual_seed(0)
    return build_token_mixer({"name": name, **options}, dims)


def ctx(causal: bool, key_padding_mask: torch.Tensor | None = None) -> ForwardContext:
    return ForwardContext(Position(), causal=causal, key_padding_mask=key_padding_mask)


def dft_matrix(n: int) -> torch.Tensor:  # (n, n) complex: F[j, k] = exp(-2 pi i j k / n)
    index = torch.arange(n, dtype=torch.float64)
    return torch.exp(-2j * math.pi * torch.outer(index, index) / n)


def randomised(layer):
    """The layer with every parameter redrawn, so that no mixing weight is near zero."""
    torch.manual_seed(1)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn_like(p) / math.sqrt(p.shape[-1]))
    return layer


# -- FNet --------------------------------------------------------------------------------------

@pytest.mark.parametrize("length", [SEQ_LEN, 5, 40])  # any length: no weights sized by seq_len
def test_fnet_is_the_real_part_of_the_2d_dft_over_sequence_and_hidden(length):
    x = torch.randn(2, length, D_MODEL, dtype=torch.float64)
    y = build("fnet")(x.float(), ctx(causal=False))
    torch.testing.assert_close(y, torch.fft.fft2(x.float()).real)
    explicit = (dft_matrix(length) @ x.to(torch.complex128) @ dft_matrix(D_MODEL)).real  # F_T x F_D
    torch.testing.assert_close(y.double(), explicit, atol=1e-4, rtol=1e-4)
    unitary = build("fnet", fft_norm="ortho")(x.float(), ctx(causal=False))
    torch.testing.assert_close(unitary, y / math.sqrt(length * D_MODEL))


def test_fnet_has_no_parameters_and_is_refused_by_the_causal_lm():
    assert not list(build("fnet").parameters())
    config = compose_config("attention=fnet", "data.seq_len=16", "model.d_model=32",
                            "model.n_heads=2", "model.d_ff=64")
    with pytest.raises(ConfigError, match="attention=fnet does not provide") as refused:
        build_model(config, vocab_size=256)
    assert "\n" not in str(refused.value) and "causal" in str(refused.value)


@pytest.mark.parametrize("name", ["fnet", "mixer", "gmlp"])
def test_padded_positions_change_no_other_output(name):
    layer = randomised(build(name))
    padding = torch.zeros(2, SEQ_LEN, dtype=torch.bool)
    padding[0, 9:] = True  # the last three positions of the first sequence
    x = torch.randn(2, SEQ_LEN, D_MODEL)
    changed = x.clone()
    changed[0, 9:] += torch.randn(3, D_MODEL)
    for direction in sorted(layer.provides & {"causal", "bidirectional"}):
        context = ctx(direction == "causal", padding)
        y = layer(x, context)
        torch.testing.assert_close(layer(changed, context)[0, :9], y[0, :9])
        assert torch.isfinite(y).all()
    if name == "fnet":  # padding is zeroing the padded positions before the transform
        torch.testing.assert_close(y, torch.fft.fft2(x.masked_fill(padding[..., None], 0)).real)


# -- MLP-Mixer ---------------------------------------------------------------------------------

def set_mixer(layer, w1, b1, w2, b2):
    with torch.no_grad():
        for p, value in zip((layer.hidden_weight, layer.hidden_bias, layer.output_weight,
                             layer.output_bias), (w1, b1, w2, b2)):
            p.copy_(value)
    return layer


def test_mixer_with_identity_like_weights_matches_hand_computed_outputs():
    n, x = SEQ_LEN, torch.randn(2, SEQ_LEN, D_MODEL)
    eye, ones, zeros = torch.eye(n), torch.ones(n, n), torch.zeros(n)
    layer = build("mixer")
    for causal in (True, False):  # identity on both layers: the MLP is GELU, per position
        set_mixer(layer, eye, zeros, eye, zeros)
        torch.testing.assert_close(layer(x, ctx(causal)), F.gelu(x))
    # W_1 all ones: hidden unit t sums positions <= t (causal) or all positions (bidirectional)
    set_mixer(layer, ones, zeros, eye, zeros)
    torch.testing.assert_close(layer(x, ctx(True)), F.gelu(x.cumsum(1)))
    torch.testing.assert_close(layer(x, ctx(False)), F.gelu(x.sum(1, keepdim=True)).expand_as(x))
    # W_2 all ones, biases 1 and 2: output t sums GELU(x_h + 1) over h <= t, plus 2
    set_mixer(layer, eye, torch.ones(n), ones, torch.full((n,), 2.0))
    torch.testing.assert_close(layer(x, ctx(True)), F.gelu(x + 1).cumsum(1) + 2)


@pytest.mark.parametrize(("causal", "token_hidden"), [(True, None), (False, None), (False, 20)])
def test_mixer_is_eq_1_of_the_paper_channel_by_channel(causal, token_hidden):
    layer = randomised(build("mixer", token_hidden=token_hidden))
    w1, b1 = layer.hidden_weight.detach(), layer.hidden_bias.detach()  # (D_S, S), (D_S,)
    w2, b2 = layer.output_weight.detach(), layer.output_bias.detach()  # (S, D_S), (S,)
    if causal:  # D_S = S: hidden unit t and output t see positions <= t
        w1, w2 = (w.masked_fill(~causal_mask(SEQ_LEN, SEQ_LEN), 0.0) for w in (w1, w2))
    x = torch.randn(2, SEQ_LEN, D_MODEL)
    expected = torch.empty_like(x)
    for b in range(2):
        for channel in range(D_MODEL):  # U_{*,i} = W_2 GELU(W_1 X_{*,i} + b_1) + b_2
            expected[b, :, channel] = w2 @ F.gelu(w1 @ x[b, :, channel] + b1) + b2
    torch.testing.assert_close(layer(x, ctx(causal)), expected, atol=1e-5, rtol=1e-5)


def test_a_mixer_wider_or_narrower_than_seq_len_is_bidirectional_only():
    assert {"causal", "bidirectional"} <= build("mixer").provides  # D_S = S
    for width in (6, 20):
        assert build("mixer", token_hidden=width).provides & {"causal", "bidirectional"} == {
            "bidirectional"}


# -- gMLP --------------------------------------------------------------------------------------

def spatial_gating_reference(layer, x, causal):
    """Section 2 of the paper, position by position: gate_t = sum_s W[t, s] LN(Z_2)_s + b_t."""
    z1, z2 = F.gelu(layer.up(x)).chunk(2, dim=-1)  # (B, T, d_ffn/2) each
    z2 = F.layer_norm(z2, z2.shape[-1:], layer.gate_norm.weight, layer.gate_norm.bias)
    w, bias, t = layer.spatial_weight, layer.spatial_bias, x.shape[1]
    seen = causal_mask(t, t) if causal else torch.ones(t, t, dtype=torch.bool)
    gate = torch.stack([sum(w[i, j] * z2[:, j] for j in range(t) if seen[i, j]) + bias[i]
                        for i in range(t)], dim=1)  # (B, T, d_ffn/2)
    return layer.out(z1 * gate)


@pytest.mark.parametrize("causal", [True, False])
def test_gmlp_matches_the_spatial_gating_unit_position_by_position(causal):
    layer = randomised(build("gmlp"))
    x = torch.randn(2, SEQ_LEN, D_MODEL)
    torch.testing.assert_close(layer(x, ctx(causal)), spatial_gating_reference(layer, x, causal),
                               atol=1e-5, rtol=1e-5)


def test_gmlp_starts_near_a_per_token_mlp_as_the_paper_initialises_it():
    layer = build("gmlp", d_ffn=12)
    assert layer.up.out_features == 12 and layer.out.in_features == 6
    assert build("gmlp").up.out_features == 6 * D_MODEL  # the paper's d_ffn = 6 d_model
    assert layer.spatial_weight.abs().max() <= 1e-3 / SEQ_LEN
    assert torch.equal(layer.spatial_bias, torch.ones(SEQ_LEN))
    x = torch.randn(2, SEQ_LEN, D_MODEL)
    per_token = layer.out(F.gelu(layer.up(x)).chunk(2, dim=-1)[0])  # f_{W,b} = 1: Y = Z_1 V
    for causal in (True, False):
        torch.testing.assert_close(layer(x, ctx(causal)), per_token, atol=1e-3, rtol=1e-3)


# -- shared: causality and lengths -------------------------------------------------------------

@pytest.mark.parametrize("name", ["mixer", "gmlp"])
def test_a_future_position_changes_no_earlier_output(name):
    layer = randomised(build(name))
    x = torch.randn(2, SEQ_LEN, D_MODEL)
    for t in (0, 5, SEQ_LEN - 2):
        changed = x.clone()
        changed[:, t + 1:] += torch.randn(2, SEQ_LEN - t - 1, D_MODEL)
        before, after = layer(x, ctx(True)), layer(changed, ctx(True))
        torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1])
        assert not torch.allclose(after[:, t + 1:], before[:, t + 1:])
        bidirectional = layer(changed, ctx(False))  # without the mask the future matters
        assert not torch.allclose(bidirectional[:, : t + 1], layer(x, ctx(False))[:, : t + 1])


@pytest.mark.parametrize("name", ["mixer", "gmlp"])
def test_a_shorter_input_uses_the_leading_positions(name):
    layer = randomised(build(name))
    x = torch.randn(2, 7, D_MODEL)
    padded = torch.cat([x, torch.zeros(2, SEQ_LEN - 7, D_MODEL)], dim=1)  # (B, S, D)
    full = torch.cat([x, torch.randn(2, SEQ_LEN - 7, D_MODEL)], dim=1)
    torch.testing.assert_close(layer(x, ctx(True)), layer(full, ctx(True))[:, :7])
    if name == "mixer":  # bidirectional: as if zero-padded to data.seq_len
        torch.testing.assert_close(layer(x, ctx(False)), layer(padded, ctx(False))[:, :7])


@pytest.mark.parametrize("name", ["mixer", "gmlp"])
def test_a_longer_input_than_seq_len_is_one_line(name):
    with pytest.raises(ConfigError, match=rf"data.seq_len={SEQ_LEN} .* {SEQ_LEN + 1}") as error:
        build(name)(torch.randn(1, SEQ_LEN + 1, D_MODEL), ctx(True))
    assert "\n" not in str(error.value)
    assert "variable_length" not in build(name).provides
