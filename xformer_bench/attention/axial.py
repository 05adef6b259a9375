"""Axial attention over a 2-D layout of the sequence (Ho, Kalchbrenner, Weissenborn &
Salimans 2019, "Axial Attention in Multidimensional Transformers"; the two-dimensional case of
Child et al. 2019's factorisation): the T positions are laid out row by row as a
(rows, cols) image, p = r * cols + c, and

    A1 (row attention)    = {j : floor(j / cols) = floor(i / cols)}
    A2 (column attention) = {j : j mod cols = i mod cols}

restricted to j <= i when causal (masked row and masked column attention).  Each is a
reshape: attention within the rows of the (rows, cols) grid, then along its columns.  Cost
O(T * (rows + cols)) per head: O(T^1.5) with the default near-square grid, declared
``sub_quadratic``; a set ``rows`` or ``cols`` x makes the other side T / x, O(T^2 / x), T^2
over a constant like ``fixed``'s set stride, and is not declared.  ``mode``
(:mod:`._factorized`): ``interleaved`` (row attention at even layers, column attention at odd,
as the Axial Transformer alternates them; the default; with ``model.share_blocks`` every block
is layer 0, so rows only), ``merged`` (one softmax over both, the query counted once) or
``multihead`` (half the heads each).

Layout: ``cols`` (the row width, e.g. an image's width in sub-pixels) or ``rows``; the other
follows from the length, the last row padded (the pad is never attended to); with neither,
cols = ceil(sqrt(T)); with both, rows x cols must equal ``data.seq_len``.
Causal limit, named: masked rows and columns never reach the part of the past above and to the
right of a position (rows above, later columns), at any depth.  The Axial Transformer fills it
with unmasked row attention over the shifted rows above (its outer decoder, §3.2-3.3), a model
assembly rather than a kernel; ``attention=strided`` with ``stride`` = cols is the Sparse
Transformer's answer (a band of the previous cols positions instead of the row).

torch.compile: not one graph (the factorised layout is built once per length from index tensors,
and whether every query has a key is read on the host (cached; traced anew by each compile);
tests/test_compile.py).
"""

from __future__ import annotations

import math

from xformer_bench.attention._ops.factorized import Blocks, Columns, FactorizedAttention, Part
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION


@ATTENTION.register("axial")
class AxialAttention(FactorizedAttention):
    option = "axial"
    decodes_by_position = False  # its grid is laid over the queries it is given

    def __init__(self, dims: ModelDims, rows: int | None = None, cols: int | None = None,
                 mode: str = "interleaved"):
        super().__init__(dims, mode)
        if any(x is not None and x < 1 for x in (rows, cols)):
            raise ConfigError(f"attention=axial: rows={rows}, cols={cols} must be positive")
        if rows and cols and rows * cols != dims.seq_len:
            raise ConfigError(f"attention=axial: rows x cols = {rows} x {cols} = {rows * cols} "
                              f"does not lay out data.seq_len={dims.seq_len}; set one of them "
                              "(the other follows) or neither (cols = ceil(sqrt(T)))")
        self.rows, self.cols = rows, cols
        self.sub_quadratic = not (rows or cols)  # a side fixed: the other grows as T, O(T^2 / x)

    def width(self, s: int) -> int:
        if self.cols:
            return self.cols
        if self.rows:
            return math.ceil(s / self.rows)
        return math.ceil(math.sqrt(s))

    def parts(self, width: int, merged: bool, causal: bool
              ) -> tuple[tuple[Part, ...], tuple[Part, ...]]:  # the same either way
        return (Blocks(width),), (Columns(width, skip_self=merged),)  # the query is in its row
