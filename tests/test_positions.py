"""Position schemes: each formula against a direct reference, causality, config agreement."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from xformer_bench.attention.full import FullAttention
from xformer_bench.config import CONF_DIR
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.models.transformer_lm import TransformerLM
from xformer_bench.position.alibi import alibi_slopes
from xformer_bench.position.t5 import relative_position_bucket
from xformer_bench.registry import POSITION

POSITION_YAMLS = sorted((Path(CONF_DIR) / "position").glob("*.yaml"))
POSITION_NAMES = [p.stem for p in POSITION_YAMLS]


def position_spec(name: str) -> dict:
    return OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / "position" / f"{name}.yaml"))


def build(name: str, dims: ModelDims, **overrides):
    return POSITION.build({**position_spec(name), **overrides}, dims=dims)


# --------------------------------------------------------------------------- configs


@pytest.mark.parametrize("path", POSITION_YAMLS, ids=POSITION_NAMES)
def test_every_position_yaml_builds(path: Path, tiny_dims: ModelDims):
    spec = OmegaConf.to_container(OmegaConf.load(path))
    position = POSITION.build(spec, dims=tiny_dims)
    q = torch.randn(2, tiny_dims.n_heads, 5, tiny_dims.head_dim)  # (B, H, T, Dh)
    bias = position.bias(5, 5, layer=tiny_dims.n_layers - 1, query=q)
    assert bias is None or bias.dense().shape[-3:] == (tiny_dims.n_heads, 5, 5)


# --------------------------------------------------------------------------- causality


@pytest.mark.parametrize("name", POSITION_NAMES)
def test_no_causal_leak_in_full_model(name: str, tiny_dims: ModelDims):
    torch.manual_seed(0)
    model = TransformerLM(tiny_dims, {"name": "full"}, {"name": "layernorm"}, {"name": "relu"},
                          position_spec(name))
    for p in model.position.parameters():  # large position parameters: any leak would show
        torch.nn.init.normal_(p, std=1.0)
    t = 5
    tokens = torch.randint(0, 256, (2, 11))  # shorter than seq_len on purpose
    perturbed = tokens.clone()
    perturbed[:, t + 1] = (tokens[:, t + 1] + 1) % 256
    logits, logits_perturbed = model(tokens), model(perturbed)  # (B, T, V)
    torch.testing.assert_close(logits[:, : t + 1], logits_perturbed[:, : t + 1], rtol=0, atol=1e-6)
    assert not torch.allclose(logits[:, t + 1], logits_perturbed[:, t + 1])
    logits.logsumexp(-1).mean().backward()  # the bias reaches its tables through SDPA
    for p in model.position.parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0


# --------------------------------------------------------------------------- rotary


def rotation_matrix(position: int, head_dim: int, base: float = 10000.0) -> torch.Tensor:
    """Block-diagonal (Dh, Dh) rotation of RoFormer eq. (15), built entry by entry."""
    matrix = torch.zeros(head_dim, head_dim, dtype=torch.float64)
    for p in range(head_dim // 2):
        angle = position * base ** (-2 * p / head_dim)
        c, s = math.cos(angle), math.sin(angle)
        matrix[2 * p, 2 * p], matrix[2 * p, 2 * p + 1] = c, -s
        matrix[2 * p + 1, 2 * p], matrix[2 * p + 1, 2 * p + 1] = s, c
    return matrix


def test_rotary_matches_rotation_matrices(tiny_dims: ModelDims):
    rotary = build("rotary", tiny_dims)
    q, k = torch.randn(2, 2, 7, tiny_dims.head_dim), torch.randn(2, 2, 7, tiny_dims.head_dim)
    q_rot, k_rot = rotary.rotate(q, k)
    for m in range(7):
        r = rotation_matrix(m, tiny_dims.head_dim).float()
        torch.testing.assert_close(q_rot[:, :, m], q[:, :, m] @ r.T, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k_rot[:, :, m], k[:, :, m] @ r.T, rtol=1e-5, atol=1e-5)


def test_rotary_score_depends_only_on_offset(tiny_dims: ModelDims):
    rotary = build("rotary", tiny_dims)
    t = tiny_dims.seq_len
    q_vec, k_vec = torch.randn(tiny_dims.head_dim), torch.randn(tiny_dims.head_dim)
    q = q_vec.expand(1, 1, t, -1)  # the same query at every position, (1, 1, T, Dh)
    k = k_vec.expand(1, 1, t, -1)
    q_rot, k_rot = rotary.rotate(q, k)
    scores = (q_rot @ k_rot.transpose(-1, -2))[0, 0]  # (T, T): scores[i, j] = q_i . k_j
    for shift in (1, 3, 7):  # shifting both positions keeps the score
        torch.testing.assert_close(scores[shift:, shift:], scores[:-shift, :-shift],
                                   rtol=1e-5, atol=1e-5)
    assert not torch.allclose(scores[5, 0], scores[5, 5])  # ... and the offset does matter


def test_rotary_queries_are_the_last_positions(tiny_dims: ModelDims):
    rotary = build("rotary", tiny_dims)
    q, k = torch.randn(1, 2, 9, tiny_dims.head_dim), torch.randn(1, 2, 9, tiny_dims.head_dim)
    q_rot, _ = rotary.rotate(q, k)
    q_tail_rot, _ = rotary.rotate(q[:, :, -3:], k)
    torch.testing.assert_close(q_tail_rot, q_rot[:, :, -3:])


# --------------------------------------------------------------------------- ALiBi


def test_alibi_slopes_follow_the_paper():
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -(h + 1) for h in range(8)]))
    expected_16 = [2.0 ** -((h + 1) / 2) for h in range(16)]
    torch.testing.assert_close(alibi_slopes(16), torch.tensor(expected_16))
    # 6 heads: the 4-head slopes 2^-2, 2^-4, 2^-6, 2^-8, then every other 8-head slope 2^-1, 2^-3.
    expected_6 = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]
    torch.testing.assert_close(alibi_slopes(6), torch.tensor(expected_6))


def test_alibi_bias_is_linear_in_distance():
    dims = ModelDims(d_model=64, n_heads=8, n_layers=1, d_ff=64, seq_len=12, vocab_size=256)
    alibi = build("alibi", dims)
    t = 10
    reference = torch.zeros(8, t, t)
    for h in range(8):
        m = 2.0 ** -(h + 1)
        for i in range(t):
            for j in range(i + 1):
                reference[h, i, j] = -m * (i - j)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    bias = alibi.bias(t, t).dense()  # (H, T, T)
    torch.testing.assert_close(bias * causal, reference)
    torch.testing.assert_close(bias, bias.transpose(-1, -2))  # keys ahead: -m (j - i)
    torch.testing.assert_close(alibi.bias(3, t).dense(), bias[:, -3:])  # queries are the last positions


# --------------------------------------------------------------------------- T5


def reference_bucket(distance: int, bidirectional: bool, num_buckets: int,
                     max_distance: int) -> int:
    """T5's bucketing for one distance ``j - i``, scalar by scalar."""
    bucket = 0
    if bidirectional:
        num_buckets //= 2
        if distance > 0:
            bucket = num_buckets
        n = abs(distance)
    else:
        n = max(-distance, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return bucket + n
    log_fraction = math.log(n / max_exact) / math.log(max_distance / max_exact)
    log_steps = log_fraction * (num_buckets - max_exact)
    return bucket + min(max_exact + int(log_steps), num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 40)])
def test_t5_buckets_match_reference(bidirectional: bool, num_buckets: int, max_distance: int):
    distances = torch.arange(-300, 301)
    got = relative_position_bucket(distances, bidirectional, num_buckets, max_distance)
    expected = [reference_bucket(d, bidirectional, num_buckets, max_distance)
                for d in distances.tolist()]
    assert got.tolist() == expected


def test_t5_bucket_landmarks():
    back = lambda n, **kw: relative_position_bucket(-torch.tensor(n), **kw).tolist()  # noqa: E731
    causal = dict(bidirectional=False, num_buckets=32, max_distance=128)
    assert back(list(range(16)), **causal) == list(range(16))  # exact below num_buckets / 2
    assert back([16, 18, 19, 64, 127], **causal) == [16, 16, 17, 26, 31]  # log-spaced
    assert back([128, 500, 10_000], **causal) == [31, 31, 31]  # clamped beyond max_distance
    assert relative_position_bucket(torch.tensor([1, 5]), **causal).tolist() == [0, 0]  # future
    both = dict(bidirectional=True, num_buckets=32, max_distance=128)
    assert back(list(range(8)), **both) == list(range(8))  # exact 0..7 per direction
    ahead = relative_position_bucket(torch.tensor([1, 7, 8, 200]), **both).tolist()
    assert ahead == [17, 23, 24, 31]
    assert back([8, 200], **both) == [8, 15]


def test_t5_bias_looks_up_head_tables(tiny_dims: ModelDims):
    t5 = build("t5", tiny_dims, num_buckets=8, max_distance=10)
    torch.nn.init.normal_(t5.tables.weight)
    t = tiny_dims.seq_len
    table = t5.tables.weight[0]  # (num_buckets, H)
    reference = torch.zeros(tiny_dims.n_heads, t, t)
    for i in range(t):
        for j in range(t):
            reference[:, i, j] = table[reference_bucket(j - i, False, 8, 10)]
    bias = t5.bias(t, t, layer=1).dense()  # (H, T, T)
    torch.testing.assert_close(bias, reference)
    torch.testing.assert_close(t5.bias(5, 5).dense(), bias[:, :5, :5])  # any t <= seq_len
    torch.testing.assert_close(t5.bias(1, 4).dense(), bias[:, 3:4, :4])  # queries are the last positions
    torch.testing.assert_close(t5.bias(t, t, layer=0).dense(), bias)  # shared across layers
    assert sum(p.numel() for p in t5.parameters()) == 8 * tiny_dims.n_heads


def test_t5_per_layer_tables(tiny_dims: ModelDims):
    t5 = build("t5", tiny_dims, shared_across_layers=False)
    assert sum(p.numel() for p in t5.parameters()) == tiny_dims.n_layers * 32 * tiny_dims.n_heads
    assert not torch.allclose(t5.bias(6, 6, layer=0).dense(), t5.bias(6, 6, layer=1).dense())
    torch.testing.assert_close(t5.bias(6, 6, layer=1).dense()[:, 5, 0], t5.tables.weight[1, 5])


# --------------------------------------------------------------------------- Shaw


def test_relative_distances_beyond_clip_share_an_embedding(tiny_dims: ModelDims):
    shaw = build("relative", tiny_dims, clip_distance=2)
    n_params = sum(p.numel() for p in shaw.parameters())
    assert n_params == tiny_dims.n_layers * (2 * 2 + 1) * tiny_dims.head_dim
    q = torch.randn(tiny_dims.head_dim).expand(1, tiny_dims.n_heads, 10, -1)  # (1, H, T, Dh)
    bias = shaw.bias(10, 10, query=q).dense()[0]  # (H, T, T)
    i = 9
    torch.testing.assert_close(bias[:, i, i - 3], bias[:, i, i - 7])  # both clipped to -2
    torch.testing.assert_close(bias[:, i, i - 2], bias[:, i, i - 3])
    assert not torch.allclose(bias[:, i, i - 1], bias[:, i, i - 2])
    with pytest.raises(ValueError, match="query"):
        shaw.bias(10, 10)


def test_relative_attention_matches_explicit_softmax(tiny_dims: ModelDims):
    torch.manual_seed(0)
    k_clip, t, layer = 3, 9, 1
    shaw = build("relative", tiny_dims, clip_distance=k_clip)
    torch.nn.init.normal_(shaw.tables.weight)
    attention = MultiHeadAttention(tiny_dims, FullAttention(tiny_dims))
    x = torch.randn(2, t, tiny_dims.d_model)  # (B, T, D)
    out = attention(x, ForwardContext(shaw, layer=layer))

    b, h, dh = 2, tiny_dims.n_heads, tiny_dims.head_dim
    q, k, v = attention.qkv(x).view(b, t, 3, h, dh).permute(2, 0, 3, 1, 4)  # (B, H, T, Dh) each
    table = shaw.tables.weight[layer]  # (2k+1, Dh)
    a = torch.zeros(t, t, dh)  # a[i, j] = table[clip(j - i) + k]
    for i in range(t):
        for j in range(t):
            a[i, j] = table[max(-k_clip, min(k_clip, j - i)) + k_clip]
    logits = (q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a)) / math.sqrt(dh)
    future = torch.ones(t, t, dtype=torch.bool).triu(1)
    weights = logits.masked_fill(future, float("-inf")).softmax(-1)  # (B, H, T, T)
    reference = attention.out((weights @ v).transpose(1, 2).reshape(b, t, -1))
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)

    shared = build("relative", tiny_dims, shared_across_layers=True)
    assert sum(p.numel() for p in shared.parameters()) == (2 * 16 + 1) * dh  # default k = 16
    torch.testing.assert_close(shared.bias(t, t, 0, query=q).dense(),
                               shared.bias(t, t, 1, query=q).dense())


def test_sinusoidal_is_vaswanis_formula_divided_by_sqrt_d():
    dims = ModelDims(d_model=8, n_heads=2, n_layers=1, d_ff=16, seq_len=5, vocab_size=256)
    table = build("sinusoidal", dims).embed(torch.zeros(1, 5, 8))[0]  # (T, D)
    for p in range(5):
        for i in range(4):
            angle = p / 10000 ** (2 * i / 8)
            assert table[p, 2 * i].item() == pytest.approx(math.sin(angle) / math.sqrt(8), abs=1e-6)
            assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle) / math.sqrt(8), abs=1e-6)


# --------------------------------------------------------------------------- beyond seq_len


@pytest.mark.parametrize("name", POSITION_NAMES)
def test_keys_longer_than_queries_and_than_seq_len(name, tiny_dims):
    """Memory or longer evaluation: 3 * seq_len keys, the queries the last seq_len of them.
    The bias and the rotation of the short queries are the last rows of the full ones."""
    torch.manual_seed(0)
    position = build(name, tiny_dims)
    t_key, t_query = 3 * tiny_dims.seq_len, tiny_dims.seq_len
    q = torch.randn(2, tiny_dims.n_heads, t_key, tiny_dims.head_dim)  # (B, H, Tk, Dh)
    k = torch.randn(2, tiny_dims.n_heads, t_key, tiny_dims.head_dim)  # (B, H, Tk, Dh)
    full = position.bias(t_key, t_key, query=q)  # lazy (.., Tk, Tk) or None
    last = position.bias(t_query, t_key, query=q[..., -t_query:, :])  # lazy (.., Tq, Tk) or None
    if full is not None:
        torch.testing.assert_close(last.dense(), full.dense()[..., -t_query:, :])
    q_full, k_full = position.rotate(q, k)
    q_last, k_last = position.rotate(q[..., -t_query:, :], k)
    torch.testing.assert_close(q_last, q_full[..., -t_query:, :])
    torch.testing.assert_close(k_last, k_full)


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_absolute_positions_beyond_seq_len(name, tiny_dims):
    position = build(name, tiny_dims, **({"max_len": 4 * tiny_dims.seq_len} if name == "learned" else {}))
    long = position.embed(torch.zeros(1, 4 * tiny_dims.seq_len, tiny_dims.d_model))  # (1, 4T, D)
    short = position.embed(torch.zeros(1, tiny_dims.seq_len, tiny_dims.d_model))  # (1, T, D)
    torch.testing.assert_close(long[:, : tiny_dims.seq_len], short)
    assert long[0, -1].abs().sum() > 0


def test_learned_positions_beyond_their_table_name_the_key(tiny_dims):
    from xformer_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="position.max_len=32"):
        build("learned", tiny_dims).embed(torch.zeros(1, 2 * tiny_dims.seq_len, tiny_dims.d_model))


@pytest.mark.parametrize("name", POSITION_NAMES)
def test_lazy_bias_on_chosen_pairs_equals_the_dense_bias(name, tiny_dims):
    """A sparse kernel evaluates the bias only on the pairs it computes (here a band of 3
    keys per query, as blocks (2, 4, 3)): the same values as the dense bias at those pairs."""
    torch.manual_seed(0)
    position = build(name, tiny_dims)
    for p in position.parameters():
        torch.nn.init.normal_(p)
    t_query, t_key = 8, 10
    q = torch.randn(2, tiny_dims.n_heads, t_query, tiny_dims.head_dim)  # (B, H, Tq, Dh)
    bias = position.bias(t_query, t_key, layer=1, query=q)
    if bias is None:
        return
    query_index = torch.arange(t_query).view(2, 4, 1)  # (blocks, block, 1)
    key_index = query_index + 2 - torch.arange(3)  # (blocks, block, 3): keys i-0..i-2 (shifted)
    dense = bias.dense()  # (.., H, Tq, Tk)
    expected = dense[..., query_index.expand_as(key_index), key_index]  # (.., H, 2, 4, 3)
    torch.testing.assert_close(bias.at(query_index, key_index), expected)
    assert bias.at(query_index, key_index).shape[-3:] == (2, 4, 3)
