"""Factorised attention (Child et al. 2019, "Generating Long Sequences with Sparse
Transformers", §4.2-5.1): two connectivity patterns A1, A2, each a reshape of the sequence.

The S key positions (the T queries are the last T of them; queries are padded in front to S)
are padded to N, a multiple of the row length l, and laid out as a (N / l, l) grid, position
p = n * l + r at row n, column r.  A :class:`Part` groups the queries and the keys each group
sees, as views of that grid: :class:`Blocks` (each row within itself: fixed A1, axial rows),
:class:`PreviousRow` (each row against the row before, within l: with Blocks, strided A1),
:class:`NextRow` (against the row after, within l: with both, bidirectional strided A1),
:class:`Columns` (the grid transposed, (i - j) mod l = 0: strided A2, axial columns) and
:class:`Summary` (the last c positions of every row, seen by all: fixed A2).  The exact
pattern inside a group (causality, the band's extent, the padded tail, key padding) is an
additive mask on that group's scores only: cost O(N * keys per query), never N x N.

``stride`` (fixed, strided) is l, or ``auto``: G = ceil(sqrt(S / c)) rows of l = ceil(S / G),
i.e. l ~ sqrt(c S), the paper's l ~ sqrt(n) (§4.2) with the constant that balances A1's l keys
per query against A2's S c / l (c = 1 for strided's columns).  Only ``auto`` is sub-quadratic:
at a fixed l the A2 part has S c / l keys per query, O(T^2 c / l) -- T^2 divided by a constant
(fixed at l = 128, c = 32: T / 4 keys per query).  With ``auto`` it is O(T sqrt(c T)).

``mode`` combines A1 and A2 in one of the paper's three ways (§5.1): ``interleaved`` (A1 at
even layers, A2 at odd, Eq. 6), ``merged`` (one softmax over A1 ∪ A2, Eq. 7, exactly, by
:class:`JointSoftmax`; A2 leaves out the keys A1 holds, so each key counts once) or
``multihead`` (the first ceil(H/2) heads A1, the others A2, Eq. 8).  Additive biases (T5,
ALiBi, Shaw) are evaluated on the computed pairs.  A query with no key (all padding, or
causal fixed A2 alone before the first summary position) gives 0.  Softmax in float32.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.joint_softmax import JointSoftmax
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias

MODES = ("interleaved", "merged", "multihead")
AUTO = "auto"
"""``stride: auto``: the row length grows as sqrt(S) (see the module docstring)."""


def balanced_width(s: int, c: int = 1) -> int:
    """l for S keys with ``stride: auto``: G = ceil(sqrt(S / c)) rows of ceil(S / G), so that
    A1's l keys and A2's S c / l keys per query are both about sqrt(c S)."""
    rows = math.ceil(math.sqrt(s / c))
    return math.ceil(s / rows)


@dataclass(frozen=True)
class Frame:
    """One call's positions: S keys (queries the last T of them), padded to N."""

    t: int
    s: int
    n: int
    causal: bool
    key_padding_mask: torch.Tensor | None = None  # (B, N) bool, True = padding (the tail too)
    bias: PairBias | None = None

    def heads(self, first: int, count: int) -> Frame:
        """The same frame for a slice of the heads (the bias sliced alike)."""
        if self.bias is None:
            return self
        bias = self.bias

        def at(query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:
            values = bias.at(query_index, key_index)  # (H, *S) or (B, H, *S)
            pair_dims = len(torch.broadcast_shapes(query_index.shape, key_index.shape))
            return values.narrow(values.dim() - pair_dims - 1, first, count)

        return replace(self, bias=PairBias(bias.t_query, bias.t_key, bias.device, at))


@dataclass(frozen=True)
class Part:
    """A pattern as a grouping of the padded sequence: queries (B, H, G, gq, D) and the keys
    each group sees (B, H, G, gk, D), with their positions (G, gq) and (G, gk)."""

    width: int  # l, the grid's row length

    def queries(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, N, D) -> (B, H, G, gq, D)
        b, h, n, d = x.shape
        return x.view(b, h, n // self.width, self.width, d)

    keys = queries  # (B, H, N, D) -> (B, H, G, gk, D)

    def query_positions(self, n: int, device: torch.device) -> torch.Tensor:  # (G, gq)
        return torch.arange(n, device=device).view(n // self.width, self.width)

    key_positions = query_positions  # (G, gk); negative: no key

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor | None:
        """The pattern's own rule on a group's pairs, beyond causality (None: all)."""
        return None

    def ungroup(self, y: torch.Tensor) -> torch.Tensor:  # (B, H, G, gq, X) -> (B, H, N, X)
        return y.flatten(2, 3)

    def regroup(self, y: torch.Tensor) -> torch.Tensor:  # (B, H, N, X) -> (B, H, G, gq, X)
        b, h, n, x = y.shape
        return y.view(b, h, n // self.width, self.width, x)


class Blocks(Part):
    """Each row of the grid attends within itself: {j : floor(j / l) = floor(i / l)}."""


class PreviousRow(Part):
    """The row before the query's, within l of it: {j : floor(j / l) = floor(i / l) - 1,
    i - j < l}.  With :class:`Blocks`, causal: the previous l positions, the query included."""

    def keys(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, N, D) -> (B, H, N/l, l, D)
        return super().keys(x).roll(1, dims=2)  # row n holds row n - 1 (row 0: never seen)

    def key_positions(self, n: int, device: torch.device) -> torch.Tensor:  # (N/l, l)
        return torch.arange(-self.width, n - self.width, device=device).view(-1, self.width)

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return i - j < self.width


class NextRow(PreviousRow):
    """The row after the query's, within l of it: {j : floor(j / l) = floor(i / l) + 1,
    j - i < l}.  With :class:`Blocks` and :class:`PreviousRow`: the positions within l of the
    query on either side."""

    def keys(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, N, D) -> (B, H, N/l, l, D)
        return Part.keys(self, x).roll(-1, dims=2)  # row n holds row n + 1 (the last: never)

    def key_positions(self, n: int, device: torch.device) -> torch.Tensor:  # (N/l, l)
        return torch.arange(self.width, n + self.width, device=device).view(-1, self.width)

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        return j - i < self.width


@dataclass(frozen=True)
class Columns(Part):
    """The grid transposed: each column attends along itself, {j : (i - j) mod l = 0};
    ``skip_self`` leaves out j = i (held by the other part in merged mode)."""

    skip_self: bool = False

    def queries(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, N, D) -> (B, H, l, N/l, D)
        return super().queries(x).transpose(2, 3)

    keys = queries

    def query_positions(self, n: int, device: torch.device) -> torch.Tensor:  # (l, N/l)
        return super().query_positions(n, device).T

    key_positions = query_positions

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor | None:
        return j != i if self.skip_self else None

    def ungroup(self, y: torch.Tensor) -> torch.Tensor:  # (B, H, l, N/l, X) -> (B, H, N, X)
        return y.transpose(2, 3).flatten(2, 3)

    def regroup(self, y: torch.Tensor) -> torch.Tensor:  # (B, H, N, X) -> (B, H, l, N/l, X)
        return super().regroup(y).transpose(2, 3)


@dataclass(frozen=True)
class Summary(Part):
    """The last c positions of every row, {j : j mod l >= l - c}, seen by every query (one
    group); ``skip_own_row`` leaves out the query's own row (held by Blocks in merged mode)."""

    c: int = 1
    skip_own_row: bool = False

    def queries(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, N, D) -> (B, H, 1, N, D)
        return x.unsqueeze(2)

    def keys(self, x: torch.Tensor) -> torch.Tensor:  # (B, H, N, D) -> (B, H, 1, N/l * c, D)
        return super().keys(x)[:, :, :, self.width - self.c:].flatten(2, 3).unsqueeze(2)

    def query_positions(self, n: int, device: torch.device) -> torch.Tensor:  # (1, N)
        return torch.arange(n, device=device)[None]

    def key_positions(self, n: int, device: torch.device) -> torch.Tensor:  # (1, N/l * c)
        return super().key_positions(n, device)[:, self.width - self.c:].reshape(1, -1)

    def allowed(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor | None:
        return i // self.width != j // self.width if self.skip_own_row else None

    def ungroup(self, y: torch.Tensor) -> torch.Tensor:  # (B, H, 1, N, X) -> (B, H, N, X)
        return y.squeeze(2)

    def regroup(self, y: torch.Tensor) -> torch.Tensor:  # (B, H, N, X) -> (B, H, 1, N, X)
        return y.unsqueeze(2)


def blocked_score(dtype: torch.dtype) -> float:
    """The score of a pair that does not exist: far below any real score, yet finite even with
    a bias added, so a query with no key at all stays finite (and is zeroed)."""
    return -0.5 * torch.finfo(dtype).max


@functools.lru_cache(maxsize=8)
def layout(parts: tuple[Part, ...], n: int, s: int, causal: bool, dtype: torch.dtype,
           device: torch.device):
    """The parts' pairs on a grid of N positions holding S keys, built once per shape.

    Per part: query and key positions (G, gq, 1) and (G, 1, gk), and the pattern as an
    additive score (G, gq, gk): 0, or :func:`blocked_score` for a pair that does not exist.
    Then which queries have a key in some part, (1, 1, N, 1) bool, or None when all S do."""
    per_part, seen = [], []
    for part in parts:
        i = part.query_positions(n, device)[..., :, None]  # (G, gq, 1)
        j = part.key_positions(n, device)[..., None, :]  # (G, 1, gk)
        exists = (j >= 0) & (j < s)  # keys off the grid's ends do not
        valid = exists.expand(torch.broadcast_shapes(i.shape, j.shape))  # (G, gq, gk)
        if causal:
            valid = valid & (j <= i)
        allowed = part.allowed(i, j)
        if allowed is not None:
            valid = valid & allowed
        additive = torch.zeros(valid.shape, dtype=dtype, device=device)
        per_part.append((i, j, additive.masked_fill_(~valid, blocked_score(dtype))))
        seen.append(part.ungroup(valid.any(-1, keepdim=True)[None, None]))  # (1, 1, N, 1)
    seen = functools.reduce(torch.logical_or, seen)
    return per_part, None if bool(seen[:, :, :s].all()) else seen


def attend(parts: tuple[Part, ...], frame: Frame, q: torch.Tensor, k: torch.Tensor,
           v: torch.Tensor) -> torch.Tensor:
    """Softmax attention over the union of the parts' keys, one softmax per query.

    q, k, v: (B, H, N, D) on the padded grid, q already scaled; returns (B, H, N, D)."""
    per_part, seen = layout(parts, frame.n, frame.s, frame.causal, q.dtype, q.device)
    padding = frame.key_padding_mask  # (B, N) or None
    scores, padded_seen = [], []
    for part, (i, j, additive) in zip(parts, per_part):
        s = part.queries(q) @ part.keys(k).transpose(-1, -2)  # (B, H, G, gq, gk)
        if frame.bias is not None:
            query_index = (i - (frame.s - frame.t)).clamp(0, frame.t - 1)
            s = s + frame.bias.at(query_index, j.clamp(0, frame.s - 1))
        s = s + additive
        if padding is not None:
            padded = padding[:, j.clamp(0, frame.n - 1)].unsqueeze(1)  # (B, 1, G, 1, gk)
            s = s.masked_fill(padded, blocked_score(s.dtype))
            has_key = (additive == 0) & ~padded  # (B, 1, G, gq, gk)
            padded_seen.append(part.ungroup(has_key.any(-1, keepdim=True)))  # (B, 1, N, 1)
        scores.append(s)
    if len(parts) == 1:
        (part,), (s,) = parts, scores
        out = part.ungroup(s.softmax(-1, dtype=torch.float32).to(v.dtype) @ part.keys(v))
    else:
        out = JointSoftmax.apply(parts, *scores, *(part.keys(v) for part in parts))
    # a query with no key (all padding; fixed A2 alone before the first summary) gives 0
    if padding is not None:
        seen = functools.reduce(torch.logical_or, padded_seen)  # (B, 1, N, 1)
    return out if seen is None else out * seen  # (B, H, N, D)


class FactorizedAttention(AttentionKernel):
    """Two parts combined by ``mode``; subclasses give the parts and, through ``stride`` or
    :meth:`width`, the grid's row length.  Sub-quadratic when the row length grows as
    sqrt(S): ``stride: auto`` (a subclass without a stride overrides :meth:`width`)."""

    provides = frozenset({"causal", "bidirectional", "additive_bias", "longer_keys",
                          "key_padding_mask", "variable_length"})
    sub_quadratic = True

    option = "factorized"  # the YAML stem, for errors

    def __init__(self, dims: ModelDims, mode: str, stride: int | str | None = None):
        super().__init__()
        if mode not in MODES:
            raise ConfigError(f"attention={self.option}: mode={mode!r}; choose one of "
                              f"{', '.join(MODES)}")
        if mode == "multihead" and dims.n_heads < 2:
            raise ConfigError(f"attention={self.option}: mode=multihead splits the heads between "
                              f"two patterns and needs model.n_heads >= 2 (got {dims.n_heads})")
        if stride is not None and stride != AUTO and not (isinstance(stride, int) and stride >= 1):
            raise ConfigError(f"attention={self.option}: stride={stride} must be at least 1, or "
                              f"{AUTO} (l ~ sqrt(T))")
        self.mode, self.stride = mode, stride
        if stride is not None:  # a fixed l: O(T^2 c / l), T^2 over a constant
            self.sub_quadratic = stride == AUTO

    def keys_per_row(self) -> int:
        """c, A2's keys per grid row, for :func:`balanced_width` (1: one column per row)."""
        return 1

    def width(self, s: int) -> int:
        """The grid's row length l for S key positions."""
        if self.stride == AUTO:
            return balanced_width(s, self.keys_per_row())
        return self.stride

    def parts(self, width: int, merged: bool, causal: bool
              ) -> tuple[tuple[Part, ...], tuple[Part, ...]]:
        """(A1, A2), each one or more parts; with ``merged``, A2 without the keys A1 holds;
        ``causal``: only the parts with a key at or before a query are needed."""
        raise NotImplementedError

    def forward(
        self,
        q: torch.Tensor,  # (B, H, T, Dh)
        k: torch.Tensor,  # (B, H, S, Dh)
        v: torch.Tensor,  # (B, H, S, Dh)
        *,
        causal: bool,
        bias: PairBias | None = None,
        key_padding_mask: torch.Tensor | None = None,  # (B, S) bool, True = padding
        layer: int = 0,
    ) -> torch.Tensor:  # (B, H, T, Dh)
        if not causal and "bidirectional" not in self.provides:
            raise ValueError(f"attention={self.option} is causal only")
        h, t, s = q.shape[1], q.shape[-2], k.shape[-2]
        width = self.width(s)
        n = math.ceil(s / width) * width
        # queries on the key positions (the last T of S), the grid's tail padded
        q = q * q.shape[-1] ** -0.5
        if n > t:
            q = F.pad(q, (0, 0, s - t, n - s))  # (B, H, N, Dh)
        if n > s:
            k, v = (F.pad(x, (0, 0, 0, n - s)) for x in (k, v))  # (B, H, N, Dh)
        if key_padding_mask is not None:
            key_padding_mask = F.pad(key_padding_mask, (0, n - s), value=True)  # (B, N)
        frame = Frame(t, s, n, causal, key_padding_mask, bias)
        a1, a2 = self.parts(width, merged=self.mode == "merged", causal=causal)
        if self.mode == "merged":
            out = attend(a1 + a2, frame, q, k, v)
        elif self.mode == "interleaved":
            out = attend(a1 if layer % 2 == 0 else a2, frame, q, k, v)
        else:
            if h < 2:
                raise ValueError(f"mode=multihead needs at least 2 heads, got {h}")
            split = (h + 1) // 2
            first = attend(a1, frame.heads(0, split), *(x[:, :split] for x in (q, k, v)))
            rest = attend(a2, frame.heads(split, h - split), *(x[:, split:] for x in (q, k, v)))
            out = torch.cat([first, rest], dim=1)  # (B, H, N, Dh)
        return out[:, :, s - t:s]  # (B, H, T, Dh)
