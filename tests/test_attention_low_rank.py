"""The low-rank / compressed family -- linformer, nystromformer, memory_compressed -- against
references built here on the shared dense one (references.py): Linformer with identity
projections (k = n = T) is full attention; Nyströmformer with a landmark per position is the
closed form of its pseudo-inverse iteration (in the SVD basis of the attention matrix) and
approaches full attention as the iteration converges; memory-compressed attention is dense
attention over explicitly compressed keys under the explicit block mask; padded keys have no
influence on any of them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from references import causal_mask, masked_softmax_attention, query_key_positions
from test_attention_zoo import LargestAllocation
from xformer_bench.attention.linformer import LinformerAttention
from xformer_bench.attention.memory_compressed import MemoryCompressedAttention
from xformer_bench.attention.nystromformer import NystromAttention, iterative_pinv, segment_means
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import default_initialised
from xformer_bench.models.token_mixer import build_token_mixer


def dims(seq_len: int, heads: int = 2, d_model: int = 32) -> ModelDims:
    return ModelDims(d_model=d_model, n_heads=heads, n_layers=2, d_ff=64, seq_len=seq_len,
                     vocab_size=256)


def qkv(t: int, s: int | None = None, seed: int = 0, heads: int = 2, dh: int = 16):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(2, heads, n, dh, generator=g) for n in (t, s or t, s or t)]


def padding_has_no_influence(kernel, t: int, causal: bool = False):
    q, k, v = qkv(t, seed=3)
    mask = torch.zeros(2, t, dtype=torch.bool)
    mask[0, 2:5], mask[1, -3:] = True, True  # some keys of each sequence
    changed_k, changed_v = k.clone(), v.clone()
    changed_k[mask[:, None, :, None].expand_as(k)] = 7.0
    changed_v[mask[:, None, :, None].expand_as(v)] = -7.0
    out = kernel(q, k, v, causal=causal, key_padding_mask=mask)
    changed = kernel(q, changed_k, changed_v, causal=causal, key_padding_mask=mask)
    torch.testing.assert_close(changed, out, atol=1e-5, rtol=1e-5)
    mask[1] = True  # a fully padded sequence: zeros, not NaN
    assert torch.isfinite(kernel(q, k, v, causal=causal, key_padding_mask=mask)).all()


# --- Linformer -------------------------------------------------------------------------------

@pytest.mark.parametrize("sharing", ["none", "headwise", "key_value"])
def test_linformer_with_identity_projections_is_full_attention(sharing):
    kernel = LinformerAttention(dims(12), k=12, sharing=sharing)
    with torch.no_grad():
        kernel.E.copy_(torch.eye(12).expand_as(kernel.E))
        kernel.F.copy_(torch.eye(12).expand_as(kernel.F))
    q, k, v = qkv(12)
    torch.testing.assert_close(kernel(q, k, v, causal=False), masked_softmax_attention(q, k, v),
                               atol=1e-5, rtol=1e-5)


def test_linformer_projects_a_shorter_input_with_the_first_columns():
    kernel = LinformerAttention(dims(20), k=6)
    q, k, v = qkv(9, 11)  # 9 queries over 11 keys (the last 9 positions), n = 20
    e, f = kernel.E.detach()[:, :, :11], kernel.F.detach()[:, :, :11]  # (H, k, 11)
    torch.testing.assert_close(kernel(q, k, v, causal=False),
                               masked_softmax_attention(q, e @ k, f @ v), atol=1e-5, rtol=1e-5)


def test_linformer_sharing_and_its_refusals():
    counts = {sharing: sum(p.numel() for p in LinformerAttention(dims(16), k=4, sharing=sharing)
                           .parameters()) for sharing in ("none", "headwise", "key_value")}
    assert counts == {"none": 2 * 2 * 4 * 16, "headwise": 2 * 4 * 16, "key_value": 4 * 16}
    shared = LinformerAttention(dims(16), k=4, sharing="key_value")
    assert shared.F is shared.E
    with pytest.raises(ConfigError, match="layerwise .* kernel built per layer"):
        LinformerAttention(dims(16), sharing="layerwise")
    q, k, v = qkv(17)
    with pytest.raises(ConfigError, match="17 keys exceed the projection length n=16"):
        LinformerAttention(dims(16), k=4)(q, k, v, causal=False)


def test_linformer_ignores_padded_keys():
    padding_has_no_influence(LinformerAttention(dims(16), k=4), t=16)


# --- Nyströmformer ---------------------------------------------------------------------------

def closed_form_nystrom(q, k, v, iterations):
    """A landmark per position: A Z_n A V with A = softmax(Q K^T / sqrt(Dh)), computed in the
    SVD basis of A (float64).  Z_0 = A^T / (||A||_1 ||A||_inf) is a polynomial in A^T, so each
    singular value sigma of A is taken to sigma x_n, x_0 = sigma^2 / (||A||_1 ||A||_inf),
    x' = x (13 - 15 x + 7 x^2 - x^3) / 4 (eq. 16); x_n -> 1 is the pseudo-inverse."""
    s = k.shape[-2]  # A is softmax attention applied to the identity as values
    a = masked_softmax_attention(q.double(), k.double(), torch.eye(s, dtype=torch.float64))
    u, sigma, vh = torch.linalg.svd(a)
    x = sigma ** 2 / (a.sum(-2).amax(-1) * a.sum(-1).amax(-1))[..., None]
    for _ in range(iterations):
        x = x * (13 - 15 * x + 7 * x ** 2 - x ** 3) / 4
    approx = u @ torch.diag_embed(sigma * x) @ vh  # A Z_n A
    return approx @ v.double(), (sigma * (1 - x)).amax()  # output, largest error left in A


def test_nystrom_with_a_landmark_per_position_is_its_closed_form_and_approaches_full():
    """The tolerances: the iteration multiplies each x = alpha sigma^2 by about 13/4 while it is
    small, so after 6 iterations singular values with sigma^2 below ~1 / (alpha 3.25^6) are not
    inverted yet; the output then differs from full attention by at most that residual,
    max sigma (1 - x_6), times ||V||_2 -- bounded here, and below 1e-3 by 30 iterations."""
    q, k, v = qkv(24)
    full = masked_softmax_attention(q, k, v)
    for iterations in (6, 30):
        kernel = NystromAttention(dims(24), n_landmarks=24, pinv_iterations=iterations,
                                  conv_kernel=0)
        out = kernel(q, k, v, causal=False)
        reference, residual = closed_form_nystrom(q, k, v, iterations)
        torch.testing.assert_close(out, reference.float(), atol=2e-4, rtol=1e-4)
        bound = residual * torch.linalg.matrix_norm(v.double(), ord=2).amax()
        assert (out - full).abs().max() <= bound + 1e-4
    assert (out - full).abs().max() < 1e-3  # converged


def test_the_iteration_converges_to_the_pseudo_inverse():
    a = torch.randn(3, 8, 8).softmax(-1)
    torch.testing.assert_close(iterative_pinv(a, 30), torch.linalg.pinv(a), atol=1e-4, rtol=1e-3)


def test_landmarks_are_segment_means_when_m_divides_t_and_balanced_otherwise():
    x = torch.randn(1, 2, 70, 4)
    torch.testing.assert_close(segment_means(x[:, :, :64], 16), x[:, :, :64].view(1, 2, 16, 4, 4)
                               .mean(-2))
    segment = torch.arange(70) * 64 // 70  # consecutive segments of 1 or 2: 58 x 1 + 6 x 2
    assert (segment.diff() >= 0).all()
    assert sorted(torch.bincount(segment).tolist()) == [1] * 58 + [2] * 6
    expected = torch.stack([x[:, :, segment == j].mean(-2) for j in range(64)], -2)
    torch.testing.assert_close(segment_means(x, 64), expected)


def test_nystrom_skip_is_a_depthwise_convolution_of_the_values_per_head():
    """Conv skip alone (no landmark path): head h's output row i is sum_r w_h[r] v_{i+r-16}."""
    kernel = NystromAttention(dims(40), n_landmarks=4)
    q, k, v = qkv(40)
    with torch.no_grad():
        plain = NystromAttention(dims(40), n_landmarks=4, conv_kernel=0)(q, k, v, causal=False)
        skip = kernel(q, k, v, causal=False) - plain
    w = kernel.conv.weight.detach()[:, 0, :, 0]  # (H, 33)
    padded = F.pad(v, (0, 0, 16, 16))  # (B, H, 40 + 32, Dh)
    expected = sum(w[:, r, None, None] * padded[:, :, r:r + 40] for r in range(33))
    torch.testing.assert_close(skip, expected, atol=1e-5, rtol=1e-5)


def test_nystrom_runs_odd_lengths_and_more_keys_and_ignores_padding():
    kernel = NystromAttention(dims(64), n_landmarks=8)
    q, k, v = qkv(21, 30)
    assert kernel(q, k, v, causal=False).shape == q.shape
    padding_has_no_influence(kernel, t=30)


# --- memory-compressed attention -------------------------------------------------------------

def explicitly_compressed(x, conv, c):
    """Block j of x (B, H, S, Dh) through the strided convolution, written out (zero padding)."""
    b, h, s, dh = x.shape
    flat = F.pad(x.transpose(1, 2).reshape(b, s, h * dh), (0, 0, 0, -s % c))  # (B, S', D)
    w = conv.weight.detach()  # (D out, D in, c)
    blocks = [sum(flat[:, j * c + r] @ w[:, :, r].T for r in range(c)) + conv.bias.detach()
              for j in range(flat.shape[1] // c)]
    return torch.stack(blocks, 1).view(b, -1, h, dh).transpose(1, 2)  # (B, H, n_blocks, Dh)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("t", "s", "c"), [(12, 12, 3), (10, 10, 3), (7, 11, 4), (9, 9, 1)])
def test_memory_compressed_is_dense_attention_over_compressed_keys_under_the_block_mask(
        causal, t, s, c):
    kernel = MemoryCompressedAttention(dims(16), compression=c)
    q, k, v = qkv(t, s)
    keys = torch.cat([explicitly_compressed(k, kernel.compress_k, c), k], -2)  # (B, H, nb + S, Dh)
    values = torch.cat([explicitly_compressed(v, kernel.compress_v, c), v], -2)
    n_blocks = -(-s // c)
    position, key = query_key_positions(t, s)  # (T, 1) query and (1, S) key positions
    block = torch.arange(n_blocks)[None, :]
    if causal:  # earlier blocks compressed, the own block uncompressed up to the query
        own = (key // c == position // c) & causal_mask(t, s)
        allowed = torch.cat([block < position // c, own], -1)
    else:  # every compressed block, no uncompressed key
        allowed = torch.cat([block >= 0, key < 0], -1).expand(t, -1)
    torch.testing.assert_close(kernel(q, k, v, causal=causal),
                               masked_softmax_attention(q, keys, values, allowed),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
def test_memory_compressed_ignores_padding(causal):
    padding_has_no_influence(MemoryCompressedAttention(dims(16), compression=3), t=16,
                             causal=causal)


def test_memory_compressed_divides_the_largest_tensor_by_the_compression():
    """Not claimed sub-quadratic (O(T^2 / c)); the paper's saving, measured at T = 512: the
    scores of a query are its T / c compressed blocks, plus its own c keys when causal."""
    t = 512
    kernel = MemoryCompressedAttention(dims(t, heads=2, d_model=64))
    q, k, v = (x.requires_grad_() for x in qkv(t, heads=2, dh=32))
    for causal in (True, False):
        with LargestAllocation() as recorder:
            kernel(q, k, v, causal=causal).sum().backward()
        assert recorder.largest / (2 * 2) <= t * (-(-t // 3) + 3), recorder.op


@pytest.mark.parametrize("name", ["linformer", "nystromformer", "memory_compressed"])
def test_the_model_wide_init_touches_only_the_projections_around_the_kernel(name):
    """The kernels' own parameters (raw projections, convolutions) are never re-initialised
    (test_init.py builds the decoder LM, which refuses the bidirectional-only two)."""
    mixer = build_token_mixer({"name": name}, dims(16))
    assert {n for n, _ in default_initialised(mixer)} == {"qkv.weight", "qkv.bias", "out.weight",
                                                          "out.bias"}
