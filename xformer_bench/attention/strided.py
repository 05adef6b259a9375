"""Strided attention, the Sparse Transformer's factorisation for data with a period (Child,
Gray, Radford & Sutskever 2019, "Generating Long Sequences with Sparse Transformers", §4.3,
Figure 3b), with stride l, chosen near sqrt(n):

    A1_i = {j : 0 <= i - j < l}                (the previous l positions, i included)
    A2_i = {j <= i : (i - j) mod l = 0}        (every l-th position back)

A1 is computed on the rows of the (T / l, l) grid (each row within itself and against the
row before it, the pairs within l kept), A2 on the grid transposed -- attention along its
columns, as the paper's kernels do ("attention with a stride of k can be computed by
transposing the matrix and computing a local window", §5.5).
Cost O(T * (2l + T / l)) per head: O(T^2 / l) at a fixed stride, so ``sub_quadratic`` is
declared only for ``stride: auto``, l ~ sqrt(T) (the paper's choice; :mod:`._factorized`),
O(T sqrt(T)).  ``mode`` combines them (:mod:`._factorized`):
``interleaved`` (A1 at even layers, A2 at odd; with ``model.share_blocks`` every block is
layer 0, so only A1), ``merged`` (one softmax over A1 ∪ A2, each key once) or ``multihead``.

Choices, named: A1 has l keys, as the reference code's band (openai/sparse_attention,
``local``: band of width ``local_attn_ctx``); the paper's set {max(0, i - l), ..., i} has l + 1,
and that extra key i - l is in A2 anyway.

Bidirectional (an encoder: classification, a translation source): the paper defines only the
causal sets, so the pattern is mirrored -- the attention matrix's upper triangle is the
transpose of its lower, as DeepSpeed's sparse attention defines ``attention="bidirectional"``
("the upper triangular part of the attention matrix is mirror of the lower triangular"):

    A1_i = {j : |i - j| < l}                   (the row after too, within l: :class:`NextRow`)
    A2_i = {j : (i - j) mod l = 0}             (the query's whole column)

Deviation from LRA's Sparse Transformer baseline (Tay et al. 2021), which keeps the causal mask
in its encoders (lra_benchmarks/models/sparse_transformer/sparse_attention.py: "all attention
patterns are causal"): an encoder here sees both sides, as every other option's does.
Defaults: l = 128, the stride of the paper's strided ImageNet 64x64 model (§7.3); the paper
does not say how its strided models combine the patterns: ``merged``, as its enwik8 model.

On CPU, causal ``merged`` without a bias or key padding runs as three fused kernel calls
(:mod:`._ops.fused_factorized`): each row causally within itself, each row against the one
before it (the columns after the query's), each column causally over the rows before; nothing
is copied or stored but the output and its normaliser (full attention's step memory).  The
general path (other modes, a bias, key padding) recomputes its gathers in the backward pass
(:mod:`._ops.recompute`); bidirectional attention takes it too, grouped as the causal
(rows, the row before and after, columns: O(T (3l + T / l)), no T x T scores).

torch.compile: one graph on the fused path (tests/test_compile.py); the general path is not
(the factorised layout, as axial).
"""

from __future__ import annotations

import torch

from xformer_bench.attention._ops.factorized import (
    Blocks,
    Columns,
    FactorizedAttention,
    NextRow,
    Part,
    PreviousRow,
)
from xformer_bench.attention._ops.fused_factorized import FusedFactorized
from xformer_bench.attention._ops.key_set_union import KeyCall, Span
from xformer_bench.attention._ops.flex import FactorizedPattern, flex_dispatch
from xformer_bench.attention._ops.recompute import recomputed
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION


@ATTENTION.register("strided")
class StridedAttention(FusedFactorized):
    option = "strided"

    def __init__(self, dims: ModelDims, stride: int | str = 128, mode: str = "merged"):
        super().__init__(dims, mode, stride)

    def flex_pattern(self, t, s, causal, layer, heads) -> FactorizedPattern:
        return FactorizedPattern("strided", self.width(s), 1, self.mode, layer, heads)

    general_forward = recomputed(FactorizedAttention.forward)
    forward = flex_dispatch(FusedFactorized.fused_forward)

    def fused_calls(self, k, v, width):
        n = k.shape[-2]
        rows = n // width
        own_rows = Span(0, n, groups=rows)
        calls = (KeyCall(0, own_rows, own_rows, causal=True),)
        if rows == 1:
            return calls, ()
        later_columns = torch.ones(width, width, dtype=torch.bool).triu(1)  # i - j < l
        columns, earlier_columns = (Span(start, stop, groups=width, columns=True)
                                    for start, stop in ((width, n), (0, n - width)))
        return calls + (
            KeyCall(1, Span(width, n, groups=rows - 1), Span(0, n - width, groups=rows - 1),
                    allowed=later_columns),  # the previous row, within l of the query
            KeyCall(2, columns, earlier_columns, causal=True),  # its column, rows before
        ), ()

    def parts(self, width: int, merged: bool, causal: bool
              ) -> tuple[tuple[Part, ...], tuple[Part, ...]]:
        # A1: own row, and the previous (and, both ways, next) row within l; the query is in A1
        rows = (Blocks(width), PreviousRow(width)) + (() if causal else (NextRow(width),))
        return rows, (Columns(width, skip_self=merged),)
