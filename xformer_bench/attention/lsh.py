"""LSH attention: Kitaev, Kaiser & Levskaya 2020, "Reformer: The Efficient Transformer" (§2),
with the details of the authors' code (trax ``LSHSelfAttention``, ``hash_vecs``, ``attend``).

A token mixer with projections of its own: a shared query/key projection, a value projection
and the output layer ``out``.

* **Shared QK** (§2): the keys are the unit-normalised queries, ``k_j = q_j / ||q_j||``; the
  logit is ``q_i . k_j`` (trax divides its unit-RMS keys by sqrt(d_k): unit-length keys, and
  the queries are not scaled).  Rotary positions rotate the shared vectors first.
* **Hashing** (§2, after Andoni et al. 2015): ``h(x) = argmax([xR; -xR])`` with a random
  Gaussian ``R`` of d_k x b/2, drawn independently per head and per round.  More than 64
  buckets are factorised (§2; b = b1 b2, one argmax over b1/2 and one over b2/2 rotations,
  b1, b2 ~ sqrt(b)), so hashing costs O(T sqrt(b) d_k), not O(T b d_k): with b = 2T/m that is
  O(T^1.5), where trax's threshold of 128 kept it O(T^2) up to T = 64 m.
* **Sort and chunk** (§2, Fig. 2): in each of ``n_hashes`` rounds positions are sorted by
  (bucket, position) and cut into chunks of ``m = chunk_size``; a chunk attends to itself and
  the chunk before (trax's ``n_chunks_before=1``).  ``n_buckets`` defaults to ``2T/m``, the
  paper's ``m = 2l / n_buckets`` (trax's default): buckets average m/2 items.
* **Self** (§2 "Shared-QK"): a query may attend to itself only when nothing else is
  available: its self-logit is lowered by 1e5 (trax ``mask_self_attention``), not masked.
* **Rounds** (§2 "Multi-round LSH attention") are combined with the softmax of their
  log-normalisers, ``o_i = sum_r exp(z_i^r - logsumexp_r z_i^r) o_i^r``.  Like trax, a key
  found in several rounds counts in each (the paper's N_ij de-duplication is not applied).

**Causal** (a deviation, for a guarantee): the paper masks keys at later *original* positions
inside the chunks.  That alone is not causal: where the chunk boundaries of the sorted order
fall depends on how many *later* tokens land in lower buckets, so which earlier keys share a
query's chunk changes with the future.  Here a causal query at sorted index s attends to the
keys at sorted indices s-m+1 .. s (inside its chunk and the previous one) that share its
bucket: since a bucket is sorted by position, that is "its own bucket's last m positions up to
itself", a function of the buckets of positions <= its own only; each position's bucket is a
function of its own vector and the rotations, so the output at t depends on tokens <= t.
Bidirectional attention is the paper's: the whole chunk and the previous one, across buckets.

**Randomness**: in training the rotations are drawn fresh every forward from torch's
generator on the device (reproducible from ``torch.manual_seed`` / Lightning's seed); in
evaluation they come from a CPU generator seeded with 0x5EED + ``ctx.layer``, so evaluation
is deterministic and layers hash differently.  ``eval_n_hashes`` evaluates with more rounds
than training (the paper's Fig. 4 trains with few hashes and evaluates with 8).

Defaults (conf/attention/lsh.yaml): chunk 64 and 4 hashes, Reformer's enwik8 setting as this project
reads it (the authors' ``reformer_enwik8.gin`` for 64K windows has chunk_len 256, n_buckets
512 = 2T/m, n_hashes 2).  Additive position biases are not supported (keys move per round).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.sparse import softmax_attention
from xformer_bench.attention._ops.sorting import chunk_rows, sort_by, take, unchunk, windows
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

SELF_PENALTY = 1e5
"""Subtracted from a query's logit on itself (Reformer; trax ``mask_self_attention``)."""
EVAL_SEED = 0x5EED
PIECE = 2 ** 20
"""(query, key) pairs scored at once: chunks are attended in pieces of about this many, so
the time stays linear in T when the scores outgrow the CPU cache (measured on a 2-core CPU,
forward + backward from T = 2048 to 8192: 4.7x in pieces, 6.6x all at once)."""


FACTOR_ABOVE = 64
"""Bucket counts hashed in one rotation; more are factorised (trax factorises above 128: at
T = 4096 and chunk 64 its unfactored 2T/m = 128 buckets made a (B, H, R, T, 128) tensor, T^2 / 8
a plane, growing as T^2).  Up to 64 the hash holds <= 64 R values per position, O(T)."""


def bucket_factors(n_buckets: int) -> list[int]:
    """The bucket counts hashed separately (§2: "for larger numbers of buckets ... factorize"):
    up to FACTOR_ABOVE one; above, two even ones n1 >= n2 >= sqrt(b) / 2, n1 n2 = b where such
    a pair exists (else the nearest product), so the rotations have (n1 + n2) / 2 = O(sqrt(b))
    columns.  Powers of two factor as trax's ``hash_vectors`` does (128 = 16 x 8)."""
    if n_buckets <= FACTOR_ABOVE:
        return [n_buckets]
    smaller = range(2 * math.ceil(math.sqrt(n_buckets) / 4), math.isqrt(n_buckets) + 1, 2)
    pairs = [(2 * max(1, round(n_buckets / (2 * f))), f) for f in smaller]  # (n1, n2), even
    return list(min(pairs, key=lambda p: (abs(p[0] * p[1] - n_buckets), p[0] + p[1])))


def hash_buckets(vectors: torch.Tensor, rotations: torch.Tensor,
                 factors: list[int]) -> torch.Tensor:
    """Buckets (B, H, R, T) of ``vectors`` (B, H, T, Dh) under ``rotations`` (H, R, Dh, sum(f)/2):
    ``argmax([xR; -xR])`` per factor, combined as mixed-radix digits."""
    rotated = torch.einsum("bhtd,hrdk->bhrtk", vectors.float(), rotations)  # (B, H, R, T, sum/2)
    buckets, radix, start = 0, 1, 0
    for factor in factors:
        part = rotated[..., start:start + factor // 2]  # (B, H, R, T, f/2)
        digit = torch.cat((part, -part), dim=-1).argmax(dim=-1)  # (B, H, R, T)
        buckets, radix, start = buckets + radix * digit, radix * factor, start + factor // 2
    return buckets


def attend_chunks(
    q: torch.Tensor,  # (G, B, H, R, m, Dh): G chunks of the sorted order
    k: torch.Tensor,  # (G, B, H, R, 2m, Dh): their keys, the previous chunk then their own
    v: torch.Tensor,  # (G, B, H, R, 2m, Dh)
    key_valid: torch.Tensor,  # (G, B, H, R, 2m) bool
    q_bucket: torch.Tensor,  # (G, B, H, R, m) long
    k_bucket: torch.Tensor,  # (G, B, H, R, 2m) long
    causal: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # (G, B, H, R, m, Dh), log-normaliser (G, B, H, R, m)
    m = q.shape[-2]
    allowed = key_valid[..., None, :]  # (G, B, H, R, 1, 2m)
    if causal:
        # keys m + i - j sorted places back, 0 <= that < m: inside a bucket the sorted order
        # is the position order, so in the query's bucket these are its last m positions <= it
        window = torch.ones(m, 2 * m, dtype=torch.bool, device=q.device).tril(m).triu(1)
        allowed = allowed & (k_bucket[..., None, :] == q_bucket[..., None]) & window
    own = torch.eye(m, device=q.device)  # (m, 2m): query i is key m + i (no in-place fill on
    self_logit = torch.cat([torch.zeros_like(own), own * -SELF_PENALTY], dim=1)  # a view: inductor)
    scores = (q @ k.transpose(-1, -2)).float() + self_logit  # (G, B, H, R, m, 2m), unscaled
    return softmax_attention(scores, allowed, v)


def lsh_chunk_attention(
    qk: torch.Tensor,  # (B, H, T, Dh), the shared queries/keys
    v: torch.Tensor,  # (B, H, T, Dh)
    buckets: torch.Tensor,  # (B, H, R, T) long, in [0, n_buckets)
    n_buckets: int,
    chunk: int,
    *,
    causal: bool,
    key_padding_mask: torch.Tensor | None = None,  # (B, T) bool, True = padding
) -> torch.Tensor:  # (B, H, T, Dh)
    b, h, t, _ = qk.shape
    rounds = buckets.shape[2]
    t_pad = math.ceil(t / chunk) * chunk
    valid = torch.ones(b, t, dtype=torch.bool, device=qk.device)
    if key_padding_mask is not None:
        valid = ~key_padding_mask
    valid = F.pad(valid, (0, t_pad - t), value=False)  # (B, Tp)
    # padding (and the tail that fills the last chunk) goes to a bucket of its own, sorted last
    buckets = F.pad(buckets, (0, t_pad - t), value=n_buckets)
    buckets = buckets.masked_fill(~valid[:, None, None, :], n_buckets)  # (B, H, R, Tp)
    position = torch.arange(t_pad, device=qk.device)  # (Tp,)
    order, undo = sort_by(buckets * t_pad + position)  # (B, H, R, Tp) each

    n = t_pad // chunk
    rows = chunk_rows(order, chunk)  # (n, B, H, R, m): rows of the (B, H, Tp) sources below
    source = lambda x: F.pad(x, (0, 0, 0, t_pad - t)).flatten(0, 2)  # noqa: E731 -- (B*H*Tp, Dh)
    queries = take(source(qk), rows)  # (n, B, H, R, m, Dh)
    keys = take(source(F.normalize(qk, dim=-1)), rows)  # (n, B, H, R, m, Dh): q / ||q||
    values = take(source(v), rows)  # (n, B, H, R, m, Dh)
    key_valid = take(valid[:, None].expand(b, h, t_pad).reshape(-1), rows)  # (n, B, H, R, m)
    bucket = buckets.gather(3, order).view(b, h, rounds, n, chunk).permute(3, 0, 1, 2, 4)

    per_piece = max(1, PIECE // (b * h * rounds * 2 * chunk * chunk))  # chunks at a time
    pieces = zip(queries.split(per_piece), windows(keys, per_piece), windows(values, per_piece),
                 windows(key_valid, per_piece, fill=False), bucket.split(per_piece),
                 windows(bucket, per_piece, fill=-1))
    parts = [attend_chunks(*piece, causal=causal) for piece in pieces]
    out = unchunk(torch.cat([o for o, _ in parts]), undo)  # (B, H, R, Tp, Dh)
    lse = unchunk(torch.cat([z for _, z in parts]), undo)  # (B, H, R, Tp)
    weights = lse.softmax(dim=2).to(out.dtype)  # (B, H, R, Tp): the rounds' shares
    return (weights[..., None] * out).sum(dim=2)[:, :, :t]  # (B, H, T, Dh)


@ATTENTION.register("lsh")
class LSHAttention(TokenMixer):
    provides = frozenset({"causal", "bidirectional", "queries_and_keys", "key_padding_mask",
                          "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, chunk_size: int = 64, n_hashes: int = 4,
                 n_buckets: int | None = None, eval_n_hashes: int | None = None):
        super().__init__()
        if n_buckets is not None and n_buckets != 1 and (n_buckets < 1 or n_buckets % 2):
            raise ValueError(f"attention.n_buckets={n_buckets}: 1 or an even number "
                             "(argmax over [xR; -xR] gives an even count), or null for 2T/chunk")
        if chunk_size < 1 or n_hashes < 1 or (eval_n_hashes is not None and eval_n_hashes < 1):
            raise ValueError("attention.chunk_size, n_hashes and eval_n_hashes must be positive")
        self.n_heads, self.head_dim = dims.n_heads, dims.head_dim
        self.chunk_size, self.n_hashes, self.n_buckets = chunk_size, n_hashes, n_buckets
        self.eval_n_hashes = eval_n_hashes or n_hashes
        self.qk = nn.Linear(dims.d_model, dims.d_model)  # shared query/key projection
        self.v = nn.Linear(dims.d_model, dims.d_model)
        self.out = nn.Linear(dims.d_model, dims.d_model)

    def buckets_for(self, length: int) -> int:
        if self.n_buckets is not None:
            return self.n_buckets
        return 2 * max(1, length // self.chunk_size)  # m = 2l / n_buckets (§2)

    def rotations(self, factors: list[int], rounds: int, layer: int,
                  device: torch.device) -> torch.Tensor:  # (H, R, Dh, sum(f)/2)
        shape = (self.n_heads, rounds, self.head_dim, sum(factors) // 2)
        if self.training:  # fresh every forward, from torch's (seeded) generator
            return torch.randn(shape, device=device)
        generator = torch.Generator().manual_seed(EVAL_SEED + layer)  # fixed in evaluation
        return torch.randn(shape, generator=generator).to(device)

    def hash(self, qk: torch.Tensor, layer: int = 0) -> tuple[torch.Tensor, int]:
        """Buckets (B, H, R, T) of the shared vectors ``qk`` (B, H, T, Dh), and their count."""
        n_buckets = self.buckets_for(qk.shape[-2])
        rounds = self.n_hashes if self.training else self.eval_n_hashes
        if n_buckets == 1:
            b, h, t, _ = qk.shape
            return torch.zeros(b, h, rounds, t, dtype=torch.long, device=qk.device), 1
        factors = bucket_factors(n_buckets)
        rotations = self.rotations(factors, rounds, layer, qk.device)
        return hash_buckets(qk.detach(), rotations, factors), math.prod(factors)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        b, t, d = x.shape
        heads = lambda y: y.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        qk, v = heads(self.qk(x)), heads(self.v(x))  # (B, H, T, Dh) each
        qk, _ = ctx.position.rotate(qk, qk)  # keys are the queries: one rotation serves both
        buckets, n_buckets = self.hash(qk, ctx.layer)  # (B, H, R, T)
        y = lsh_chunk_attention(qk, v, buckets, n_buckets, self.chunk_size, causal=ctx.causal,
                                key_padding_mask=ctx.key_padding_mask)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).reshape(b, t, d))
