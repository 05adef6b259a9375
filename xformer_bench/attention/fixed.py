"""Fixed attention, the Sparse Transformer's factorisation for data without a period, such as
text (Child, Gray, Radford & Sutskever 2019, "Generating Long Sequences with Sparse
Transformers", §4.3, Figure 3c), with stride l and summary width c:

    A1_i = {j : floor(j / l) = floor(i / l)}   (the query's own block of l)
    A2_i = {j : j mod l in {l - c, ..., l - 1}} (the last c positions of every block)

restricted to j <= i when causal; bidirectional is the same sets unrestricted (the formula
has no causal part).  A1 is attention within rows of the (T / l, l) grid; A2's keys are the
grid's last c columns, T c / l of them, that every query sees.  Cost O(T * (l + T c / l)) per
head: at a fixed stride that is O(T^2 c / l), T^2 over a constant (l = 128, c = 32: T / 4 keys
per query), so ``sub_quadratic`` is declared only for ``stride: auto``: l ~ sqrt(c T), the
paper's l ~ sqrt(n) (§4.2; :func:`._factorized.balanced_width`), O(T sqrt(c T)), c capped at l
on short inputs.  ``mode`` combines them (:mod:`._factorized`): ``interleaved`` (A1 at even
layers, A2 at odd; with ``model.share_blocks`` every block is layer 0, so only A1),
``merged`` (one softmax over A1 ∪ A2; A2 then leaves out the query's own block, which A1
holds) or ``multihead``.

Defaults (conf/attention/fixed.yaml): l = 128, c = 32 and ``merged``, the paper's enwik8
model (§7.2: "We used a stride of 128, c = 32, and merged the factorized attention heads"; §4.3
also names c = 8 and 16).  Not implemented: each head its own c-wide sub-block of the block
(§4.3's last paragraph; the code's ``num_verts``): every head sees the last c positions, as the
formula.

On CPU, causal ``merged`` without a bias or key padding runs as fused kernel calls
(:mod:`._ops.fused_factorized`): A1 one call over the rows folded into groups, A2 calls of
about 512 queries against the summary columns of the rows before theirs (:func:`summary_calls`),
so only causal pairs are scored (up to a staircase within a chunk) and no scores are stored:
1.03x full attention's step memory (the gathered summary columns; the README's table).
Not efficient at every length: at l = 128, c = 32 a query attends its row and a quarter of the
positions before it, 27 % of full attention's causal pairs at T = 4096, so no kernel can save
more than 73 % of full attention's time in the training step there (measured: 64 %, 69 % at
8192; results/bench/attention_step.md); ``stride=auto`` is the sub-quadratic setting.

torch.compile: one graph on the fused path (tests/test_compile.py); the general path is not
(the factorised layout, as axial).
"""

from __future__ import annotations

import functools

import torch

from xformer_bench.attention._ops.factorized import AUTO, Blocks, Part, Summary
from xformer_bench.attention._ops.fused_factorized import FusedFactorized
from xformer_bench.attention._ops.key_set_union import KeyCall, Span
from xformer_bench.attention._ops.flex import FactorizedPattern, flex_dispatch
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION


@ATTENTION.register("fixed")
class FixedAttention(FusedFactorized):
    option = "fixed"

    def __init__(self, dims: ModelDims, stride: int | str = 128, summary: int = 32,
                 mode: str = "merged"):
        super().__init__(dims, mode, stride)
        if not 1 <= summary <= (summary if stride == AUTO else stride):
            raise ConfigError(f"attention=fixed: summary={summary} (c) must lie between 1 and "
                              f"stride={stride} (l)")
        self.summary = summary

    def keys_per_row(self) -> int:
        return self.summary

    def flex_pattern(self, t, s, causal, layer, heads) -> FactorizedPattern:
        width = self.width(s)
        return FactorizedPattern("fixed", width, min(self.summary, width), self.mode, layer, heads)

    forward = flex_dispatch(FusedFactorized.fused_forward)

    def fused_calls(self, k, v, width):
        (b, h, n, d), c = k.shape, min(self.summary, width)
        rows = n // width
        columns = tuple(x.reshape(b, h, rows, width, d)[:, :, :, width - c:].reshape(b, h, -1, d)
                        for x in (k, v))  # (B, H, rows c, D): A2's keys, the summary columns
        return summary_calls(rows, width, c), columns

    def parts(self, width: int, merged: bool, causal: bool
              ) -> tuple[tuple[Part, ...], tuple[Part, ...]]:  # the same either way
        c = min(self.summary, width)  # stride auto on a short input: a row shorter than c
        return (Blocks(width),), (Summary(width, c, skip_own_row=merged),)


CHUNK_QUERIES = 512
"""Queries per summary call: at l = 128, chunks of 4 rows ran the layer 1.2-1.5x faster than one
call per row (CPU, T = 4096, forward + backward)."""


@functools.lru_cache(maxsize=32)
def summary_calls(rows: int, width: int, c: int) -> tuple[KeyCall, ...]:
    """Each row causally within itself, and row r against the summary columns of rows < r (key
    set 1), in chunks of about 512 queries (CHUNK_QUERIES): a chunk of rows [a, e) sees the
    columns of rows < a whole, and those of rows a .. e - 2 through a staircase pattern."""
    own_rows = Span(0, rows * width, groups=rows)
    calls = [KeyCall(0, own_rows, own_rows, causal=True)]
    per_chunk = max(1, CHUNK_QUERIES // width)
    for a in range(1, rows, per_chunk):
        e = min(a + per_chunk, rows)
        calls.append(KeyCall(1, Span(a * width, e * width), Span(0, a * c), source=1))
        if e - a > 1:  # rows a + 1 .. e - 1 against the columns of rows a .. e - 2
            row = torch.arange(a + 1, e).repeat_interleave(width)[:, None]
            key_row = torch.arange(a, e - 1).repeat_interleave(c)[None]
            calls.append(KeyCall(2, Span((a + 1) * width, e * width),
                                 Span(a * c, (e - 1) * c), source=1, allowed=key_row < row))
    return tuple(calls)
