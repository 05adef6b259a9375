"""Which (query, key) pairs an attention option attends at a given length, measured exactly.

Attention is linear in the values for every softmax or linear kernel given the queries and
keys: ``out_i = sum_j P_ij v_j`` (plus, for persistent memory or compressed keys, a term that
does not depend on the values: the output at ``V = 0``, subtracted).  Feeding ``V`` = columns
of the identity, ``Dh`` keys at a time (``v_{j0+c} = e_c``), gives ``out[:, :, i, c] =
P[i, j0 + c]``: the weights, chunk by chunk, in ``T / Dh`` forward passes with no T x T tensor
kept.  A pair is attended when its weight is not exactly 0.  The kernel runs in evaluation mode
(no dropout) on Gaussian queries and keys with a fixed seed (random features, hashing and
random blocks drawn the same way each pass); the probe leaves the global random state as it
found it.

The premise is checked, not assumed: the weights must rebuild the output for random values
(shared by the heads, so kernels mixing heads after the softmax pass).  A kernel that mixes
features within a token instead (XCiT's channel attention) fails it and reports no fraction.
Token mixers without queries and keys (convolutions, FNet, MLP mixers) report no fraction;
convolutions their kernel's reach.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from xformer_bench.attention import AttentionKernel, TokenMixer
from xformer_bench.attention._ops.conv import KernelWidths
from xformer_bench.attention.lsh import LSHAttention, lsh_chunk_attention
from xformer_bench.errors import ConfigError
from xformer_bench.registry import DESCRIPTIVE_KEYS

Attend = Callable[..., torch.Tensor]  # (q, k, v, *, causal, layer) -> out, all (B, H, T, Dh)
PROBE_SCORES = 2 ** 24
"""(head, query, key) scores a pass may hold: chunks go through the batch this many at once."""
MAX_PROBED_LENGTH = 8192
"""Longer runs are not probed: T / Dh passes of up to T^2 scores each."""
SEED = 0
DENSE = 0.95
"""A sub-quadratic option attending this fraction of the allowed pairs is full attention here."""
LONGER = 16
"""Where such an option is probed again, T times this (at most MAX_PROBED_LENGTH): a pattern
that skips pairs skips them there."""


@dataclass(frozen=True)
class LayerCoverage:
    attended: int           # allowed (head, query, key) triples with a nonzero weight
    allowed: int            # causal: H T (T + 1) / 2; bidirectional: H T^2
    keys_per_query: torch.Tensor  # (H, T) long: attended keys of each query


def _pair_weights(attend: Attend, q: torch.Tensor, k: torch.Tensor, causal: bool,
                  layer: int) -> Iterable[tuple[int, torch.Tensor]]:
    """(j0, out (H, T, w)): the weights of keys j0 .. j0 + w - 1 for every head and query."""
    _, h, t, dh = q.shape
    per_pass = max(1, PROBE_SCORES // (h * t * t))
    def run(v: torch.Tensor) -> torch.Tensor:  # (n, H, T, Dh) -> (n, H, T, Dh)
        n = len(v)
        return attend(q.expand(n, -1, -1, -1).contiguous(), k.expand(n, -1, -1, -1).contiguous(),
                      v, causal=causal, layer=layer)

    starts = list(range(0, t, dh))
    base = run(torch.zeros(1, h, t, dh))  # (1, H, T, Dh): what the values do not carry
    for first in range(0, len(starts), per_pass):
        group = starts[first:first + per_pass]
        v = torch.zeros(len(group), h, t, dh)  # (n, H, T, Dh): one-hot rows, a chunk each
        for row, j0 in enumerate(group):
            width = min(dh, t - j0)
            v[row, :, j0:j0 + width, :width] = torch.eye(width)
        out = run(v)  # (n, H, T, Dh)
        if base.any():  # same batch size: the same arithmetic as the pass
            out = out - run(torch.zeros_like(v))
        for row, j0 in enumerate(group):
            yield j0, out[row, :, :, :min(dh, t - j0)]


def layer_coverage(attend: Attend, n_heads: int, head_dim: int, seq_len: int, *,
                   causal: bool, layer: int) -> LayerCoverage | None:
    """The pairs ``attend`` attends at ``seq_len`` for layer ``layer``; None where the output
    is not a per-pair weighting of the values (the rebuild check)."""
    g = torch.Generator().manual_seed(SEED)
    q, k = (torch.randn(1, n_heads, seq_len, head_dim, generator=g) for _ in range(2))
    check = torch.randn(1, 1, seq_len, head_dim, generator=g).expand(1, n_heads, -1, -1)
    query = torch.arange(seq_len)[:, None]  # (T, 1)
    keys = torch.zeros(n_heads, seq_len, dtype=torch.long)  # (H, T)
    rebuilt = torch.zeros(n_heads, seq_len, head_dim)  # (H, T, Dh): P @ check
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(SEED)  # the CPU alone: no lazy CUDA seeding
        for j0, weights in _pair_weights(attend, q, k, causal, layer):  # (H, T, w)
            allowed = (j0 + torch.arange(weights.shape[-1]) <= query) if causal else True
            keys += ((weights != 0) & allowed).sum(-1)
            rebuilt += weights @ check[0, :, j0:j0 + weights.shape[-1]]
        torch.random.default_generator.manual_seed(SEED)  # the CPU alone: no lazy CUDA seeding
        out = attend(q, k, check, causal=causal, layer=layer) - attend(
            q, k, torch.zeros_like(check), causal=causal, layer=layer)  # (1, H, T, Dh)
    if not torch.allclose(out[0], rebuilt, rtol=1e-3, atol=1e-4 * float(out.abs().max()) + 1e-6):
        return None
    pairs = seq_len * (seq_len + 1) // 2 if causal else seq_len * seq_len
    return LayerCoverage(int(keys.sum()), n_heads * pairs, keys)


def attend_of(mixer: nn.Module) -> tuple[Attend, int, int] | None:
    """(attend, heads, head size) of a mixer with queries and keys; None for one without."""
    kernel = getattr(mixer, "kernel", None)
    if isinstance(kernel, AttentionKernel):  # MultiHeadAttention and its subclasses
        return kernel, mixer.n_heads, mixer.head_dim
    if isinstance(mixer, LSHAttention):  # shared QK: the keys are the queries
        def lsh(q, k, v, *, causal, layer):
            return lsh_chunk_attention(q, v, *mixer.hash(q, layer), mixer.chunk_size, causal=causal)
        return lsh, mixer.n_heads, mixer.head_dim
    if isinstance(mixer, AttentionKernel):
        return mixer, None, None  # a bare kernel: the caller names its heads
    return None


def reach(mixer: nn.Module, layer: int, causal: bool) -> int | None:
    """Keys a query reads in a convolution (its kernel width at ``layer``); None otherwise."""
    widths = next((m.widths for m in mixer.modules()
                   if isinstance(getattr(m, "widths", None), KernelWidths)), None)
    return None if widths is None else widths.at(layer, causal=causal)


def attention_coverage(mixer: nn.Module, seq_len: int, layers: Iterable[int], *, causal: bool,
                       n_heads: int | None = None, head_dim: int | None = None) -> dict:
    """The record's ``attention_coverage``: over the probed layers, the fraction of allowed
    (query, key) pairs attended and the keys a query attends (mean, max); None where not
    measured, ``not_probed`` saying why."""
    layers = list(layers)
    result = {"attended_fraction": None, "keys_per_query_mean": None, "keys_per_query_max": None,
              "layers_probed": layers, "per_layer": None, "causal": causal, "seq_len": seq_len,
              "reach": None, "not_probed": None}
    view = attend_of(mixer)
    if view is None:
        reaches = [reach(mixer, layer, causal) for layer in layers]
        result["reach"] = None if None in reaches else max(reaches)
        result["not_probed"] = f"{type(mixer).__name__} has no (q, k, v) kernel to probe"
        return result
    if seq_len > MAX_PROBED_LENGTH:
        result["not_probed"] = f"T={seq_len} > {MAX_PROBED_LENGTH}: T/Dh passes of T^2 work"
        return result
    attend, heads, size = view[0], view[1] or n_heads, view[2] or head_dim
    modules = [m for m in (mixer, attend) if isinstance(m, nn.Module)]
    training = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        with torch.no_grad():
            probed = [layer_coverage(attend, heads, size, seq_len, causal=causal, layer=layer)
                      for layer in layers]
    finally:
        for m, mode in zip(modules, training):
            m.train(mode)
    if None in probed:
        result["not_probed"] = "its output is not a weighting of the values by (query, key) pair"
        return result
    keys = torch.stack([c.keys_per_query for c in probed]).float()  # (L, H, T)
    attended, allowed = sum(c.attended for c in probed), sum(c.allowed for c in probed)
    result.update(attended_fraction=attended / allowed,
                  keys_per_query_mean=float(keys.mean()), keys_per_query_max=int(keys.max()),
                  per_layer=[c.attended / c.allowed for c in probed])
    return result


def first_token_mixer(model: nn.Module) -> TokenMixer | None:
    """The model's first token mixer (its blocks' mixers share one option)."""
    return next((m for m in model.modules() if isinstance(m, TokenMixer)), None)


def refuse_dense(coverage: dict | None, attention: dict, mixer: nn.Module, *, study: str | None,
                 controls: dict | None, length: str) -> None:
    """ConfigError when a study runs an option that claims sub-quadratic cost by skipping pairs
    at a length where it attends >= :data:`DENSE` of them, unless the study declares it a
    control (``controls: {attention: [...]}``).  Skipping pairs is told from dense-by-design
    options (linear attention, Performer: every pair at any length) by probing one layer again
    at :data:`LONGER` times the length.  Outside a study (``study`` None) nothing is refused."""
    fraction = (coverage or {}).get("attended_fraction")
    name = attention["name"]
    declared = list((controls or {}).get("attention") or ())
    if (study is None or not mixer.sub_quadratic or fraction is None or fraction < DENSE
            or name in declared or "variable_length" not in mixer.provides):
        return
    t = min(LONGER * coverage["seq_len"], MAX_PROBED_LENGTH)
    longer = attention_coverage(mixer, t, [0], causal=coverage["causal"])["attended_fraction"]
    if longer is None or longer >= DENSE:
        return  # dense by design: its cost is not in the pairs it skips
    settings = {k: v for k, v in attention.items() if k not in DESCRIPTIVE_KEYS}
    shown = ", ".join(f"{k} {v}" for k, v in settings.items())
    keys = " or ".join(f"attention.{k}" for k in settings) or "its settings"
    pairs = "causal" if coverage["causal"] else "bidirectional"
    raise ConfigError(
        f"attention={name} attends {100 * fraction:.0f} % of the {pairs} pairs at {length}"
        f"{f' ({shown})' if shown else ''} ({100 * longer:.0f} % at T={t}): it is full "
        f"attention here; run it at a length where it is sparse, change {keys}, or declare it "
        f"a control of experiment={study} "
        f"(controls: {{attention: [{', '.join([*declared, name])}]}})")
