"""The shared references (references.py) checked themselves: tiny cases computed by hand, the
masks written out, the house's convention (queries are the last T of S keys, a query with no
allowed key gives 0), agreement with torch's scaled_dot_product_attention where that is
defined, the linear-attention recurrence against its materialised form, and the step-by-step
decoder's feeding order."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from references import (band_mask, causal_mask, decode_step_by_step, kernel_attention,
                        kernel_attention_recurrence, masked_softmax_attention,
                        query_key_positions)

LN3 = math.log(3.0)


def t4(rows) -> torch.Tensor:
    """A (1, 1, n, d) tensor from a list of rows: one batch, one head."""
    return torch.tensor(rows, dtype=torch.float64)[None, None]


# --- masked_softmax_attention ---------------------------------------------------------------

def test_one_query_over_two_keys_by_hand():
    """Dh = 4, default scale 1/2: q.k_1 / 2 = ln 3, q.k_2 = 0, so the weights are 3/4 and 1/4
    and the output 3/4 * 4 + 1/4 * 8 = 5 (and 3/4 * 0 + 1/4 * -4 = -1)."""
    q = t4([[LN3, LN3, 0.0, 0.0]])
    k = t4([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    v = t4([[4.0, 0.0], [8.0, -4.0]])
    torch.testing.assert_close(masked_softmax_attention(q, k, v), t4([[5.0, -1.0]]))


def test_scale_and_bias_by_hand():
    """Scale 1 doubles the score to 2 ln 3 (weights 9/10, 1/10: 4.4); a bias of -ln 3 on the
    first key brings the default-scale scores level (weights 1/2, 1/2: 6)."""
    q = t4([[LN3, LN3, 0.0, 0.0]])
    k = t4([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    v = t4([[4.0], [8.0]])
    torch.testing.assert_close(masked_softmax_attention(q, k, v, scale=1.0), t4([[4.4]]))
    bias = torch.tensor([[-LN3, 0.0]], dtype=torch.float64)  # (T, S)
    torch.testing.assert_close(masked_softmax_attention(q, k, v, bias=bias), t4([[6.0]]))


def test_causal_padding_and_allowed_by_hand():
    """Two queries over three keys (positions 1, 2) with equal scores: a query's output is the
    mean of the values it may see."""
    q, k = (torch.zeros(1, 1, n, 4, dtype=torch.float64) for n in (2, 3))
    v = t4([[1.0], [2.0], [6.0]])
    torch.testing.assert_close(masked_softmax_attention(q, k, v), t4([[3.0], [3.0]]))
    torch.testing.assert_close(masked_softmax_attention(q, k, v, causal=True), t4([[1.5], [3.0]]))
    padding = torch.tensor([[True, False, False]])  # (B, S): key 0 unseen
    torch.testing.assert_close(masked_softmax_attention(q, k, v, causal=True, padding=padding),
                               t4([[2.0], [4.0]]))
    allowed = torch.tensor([[False, False, True], [True, False, True]])  # (T, S)
    torch.testing.assert_close(masked_softmax_attention(q, k, v, allowed), t4([[6.0], [3.5]]))
    torch.testing.assert_close(masked_softmax_attention(q, k, v, allowed, causal=True),
                               t4([[0.0], [3.5]]))  # query 0 (position 1) may not see key 2


def test_a_query_with_no_allowed_key_gives_zero_and_leaves_the_others_alone():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 4, generator=g, dtype=torch.float64, requires_grad=True)
               for n in (3, 5, 5))
    allowed = torch.ones(3, 5, dtype=torch.bool)
    allowed[1] = False  # query 1: no key
    padding = torch.zeros(2, 5, dtype=torch.bool)
    padding[1] = True  # batch 1: every key padded
    out = masked_softmax_attention(q, k, v, allowed, padding=padding)
    assert torch.equal(out[:, :, 1], torch.zeros(2, 2, 4, dtype=torch.float64))
    assert torch.equal(out[1], torch.zeros(2, 3, 4, dtype=torch.float64))
    torch.testing.assert_close(out[0, :, [0, 2]], masked_softmax_attention(q, k, v)[0, :, [0, 2]])
    out.sum().backward()
    assert all(torch.isfinite(x.grad).all() for x in (q, k, v))


def test_masked_softmax_attention_agrees_with_torchs_sdpa():
    """Where torch's kernel is defined (every query sees a key): a mask, a bias, causal with
    more keys than queries (bottom-right: the queries are the last T), padding, a scale."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(2, 3, 7, 8, generator=g, dtype=torch.float64) for _ in range(2))
    bias = torch.randn(3, 4, 7, generator=g, dtype=torch.float64)
    p, j = query_key_positions(4, 7)
    allowed = (torch.rand(4, 7, generator=g) < 0.6) | (j == p)  # each query sees itself
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, :2] = True
    sdpa_mask = (allowed & causal_mask(4, 7) & ~padding[:, None, None, :])
    assert sdpa_mask.any(-1).all()
    expected = F.scaled_dot_product_attention(
        q, k, v, attn_mask=bias.masked_fill(~sdpa_mask, float("-inf")), scale=0.3)
    out = masked_softmax_attention(q, k, v, allowed, causal=True, bias=bias, padding=padding,
                                   scale=0.3)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(masked_softmax_attention(q, k, v),
                               F.scaled_dot_product_attention(q, k, v), atol=1e-12, rtol=1e-12)


# --- masks ----------------------------------------------------------------------------------

def test_masks_by_hand():
    p, j = query_key_positions(2, 4)
    assert p.tolist() == [[2], [3]] and j.tolist() == [[0, 1, 2, 3]]
    assert causal_mask(2, 4).int().tolist() == [[1, 1, 1, 0], [1, 1, 1, 1]]
    assert causal_mask(3, 3).int().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    assert band_mask(4, 4, 1).int().tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0],
                                                 [0, 0, 1, 1]]
    assert band_mask(3, 3, 0, 1).int().tolist() == [[1, 1, 0], [0, 1, 1], [0, 0, 1]]
    # dilation 2: every other key back, on the query's residue class; queries at 3, 4 of 5
    assert band_mask(2, 5, 1, 1, dilation=2).int().tolist() == [[0, 1, 0, 1, 0], [0, 0, 1, 0, 1]]


# --- linear attention -----------------------------------------------------------------------

def test_kernel_attention_by_hand():
    """One feature: weights phi(q) phi(k) = 1 and 3 over values 2 and 6 give (2 + 18) / 4 = 5;
    causal, the first query (position 0) sees only the first key: 2."""
    phi_q, phi_k, v = t4([[1.0], [1.0]]), t4([[1.0], [3.0]]), t4([[2.0], [6.0]])
    torch.testing.assert_close(kernel_attention(phi_q, phi_k, v, eps=0.0), t4([[5.0], [5.0]]))
    torch.testing.assert_close(kernel_attention(phi_q, phi_k, v, causal=True, eps=0.0),
                               t4([[2.0], [5.0]]))
    torch.testing.assert_close(kernel_attention(phi_q, phi_k, v, causal=True, eps=1.0),
                               t4([[1.0], [4.0]]))  # 2 / (1 + 1), 20 / (4 + 1)
    padding = torch.tensor([[True, False]])
    torch.testing.assert_close(kernel_attention(phi_q, phi_k, v, causal=True, padding=padding,
                                                eps=0.0), t4([[0.0], [6.0]]))  # no key: 0


def test_kernel_attention_recurrence_by_hand():
    """Running sums: S_1 = 1 * 2, z_1 = 1; S_2 = 2 + 3 * 6 = 20, z_2 = 4; the queries 1 and 2
    scale numerator and denominator alike: 2, 5 (with eps 1: 1, 40 / 9)."""
    phi_q, phi_k, v = t4([[1.0], [2.0]]), t4([[1.0], [3.0]]), t4([[2.0], [6.0]])
    torch.testing.assert_close(kernel_attention_recurrence(phi_q, phi_k, v, eps=0.0),
                               t4([[2.0], [5.0]]))
    torch.testing.assert_close(kernel_attention_recurrence(phi_q, phi_k, v, eps=1.0),
                               t4([[1.0], [40.0 / 9.0]]))


def test_the_recurrence_is_the_materialised_causal_linear_attention():
    g = torch.Generator().manual_seed(2)
    phi_q, phi_k = (torch.rand(2, 3, 11, 5, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64)
    for eps in (0.0, 1e-6, 0.5):
        recurrence = kernel_attention_recurrence(phi_q, phi_k, v, eps)
        torch.testing.assert_close(recurrence, kernel_attention(phi_q, phi_k, v, causal=True,
                                                                eps=eps), atol=1e-12, rtol=1e-12)
        weights = (phi_q @ phi_k.transpose(-1, -2)).tril()  # (B, H, T, T) written out again
        torch.testing.assert_close(recurrence, weights @ v / (weights.sum(-1, keepdim=True) + eps),
                                   atol=1e-12, rtol=1e-12)
    # a feature per key position, phi(k_j) = e_j and phi(q_i)_j = exp(q_i.k_j / sqrt(Dh)),
    # no eps: the recurrence is causal softmax attention
    q, k = (torch.randn(2, 3, 11, 4, generator=g, dtype=torch.float64) for _ in range(2))
    exp_scores = torch.exp(q @ k.transpose(-1, -2) / 2)  # (B, H, T, T)
    eye = torch.eye(11, dtype=torch.float64).expand(2, 3, 11, 11)  # (B, H, T, F = T)
    torch.testing.assert_close(kernel_attention_recurrence(exp_scores, eye, v, eps=0.0),
                               masked_softmax_attention(q, k, v, causal=True),
                               atol=1e-12, rtol=1e-12)


# --- decode_step_by_step --------------------------------------------------------------------

class _Recorder(torch.nn.Module):
    """Stands in for a TransformerLM: records what decode is fed and returns it, as floats."""

    def __init__(self):
        super().__init__()
        self.fed, self.caches = [], []

    def decode(self, tokens, cache):
        self.fed.append(tokens.tolist())
        self.caches.append(cache)
        return tokens[..., None].float()  # (B, T, 1)


def test_decode_step_by_step_feeds_the_prefix_then_one_token_per_step_through_one_cache():
    tokens = torch.tensor([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    model = _Recorder()
    out = decode_step_by_step(model, tokens, prefix=2)
    assert model.fed == [[[1, 2], [6, 7]], [[3], [8]], [[4], [9]], [[5], [10]]]
    assert all(cache is model.caches[0] for cache in model.caches)
    assert torch.equal(out, tokens[..., None].float())


def test_decode_step_by_step_of_a_small_lm_is_its_forward_pass():
    from xformer_bench.core.dims import ModelDims
    from xformer_bench.models.transformer_lm import TransformerLM

    dims = ModelDims(d_model=32, n_heads=4, n_layers=2, d_ff=64, seq_len=16, vocab_size=64)
    torch.manual_seed(0)
    model = TransformerLM(dims, {"name": "full"}, {"name": "layernorm"}, {"name": "gelu"},
                          {"name": "sinusoidal"}).eval()
    tokens = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(tokens)
    for prefix in (1, 4):
        torch.testing.assert_close(decode_step_by_step(model, tokens, prefix), full,
                                   atol=1e-5, rtol=1e-5)
