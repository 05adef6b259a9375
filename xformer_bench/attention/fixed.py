"""Fixed attention, the Sparse Transformer's factorisation for data without a period, such as
text (Child, Gray, Radford & Sutskever 2019, "Generating Long Sequences with Sparse
Transformers", §4.3, Figure 3c), with stride l and summary width c:

    A1_i = {j : floor(j / l) = floor(i / l)}   (the query's own block of l)
    A2_i = {j : j mod l in {l - c, ..., l - 1}} (the last c positions of every block)

restricted to j <= i when causal; bidirectional is the same sets unrestricted (the formula
has no causal part).  A1 is attention within rows of the (T / l, l) grid; A2's keys are the
grid's last c columns, T c / l of them, that every query sees.  Cost O(T * (l + T c / l)) per
head.  ``mode`` combines them (:mod:`._factorized`): ``interleaved`` (A1 at even layers, A2 at
odd; with ``model.share_blocks`` every block is layer 0, so only A1), ``merged`` (one softmax
over A1 ∪ A2; A2 then leaves out the query's own block, which A1 holds) or ``multihead``.

Defaults: l = 128 and ``merged``, the paper's enwik8 model (§7.2: "We used a stride of 128,
c = 32, and merged the factorized attention heads"); c = 8, the low end of the range the paper
recommends (§4.3: c in {8, 16, 32} for l in {128, 256}; its worked example uses l = 128,
c = 8), because A2 costs c times strided attention's (§4.3): at c = 32 every query scores
T / 4 keys, a quarter of full attention's pairs.  ``attention.summary=32`` is the enwik8
recipe.  Not implemented: each head its own c-wide sub-block of the block (§4.3's last
paragraph; the code's ``num_verts``): every head sees the last c positions, as the formula.
"""

from __future__ import annotations

from xformer_bench.attention._factorized import Blocks, FactorizedAttention, Part, Summary
from xformer_bench.errors import ConfigError
from xformer_bench.models.dims import ModelDims
from xformer_bench.registry import ATTENTION


@ATTENTION.register("fixed")
class FixedAttention(FactorizedAttention):
    option = "fixed"

    def __init__(self, dims: ModelDims, stride: int = 128, summary: int = 8,
                 mode: str = "merged"):
        super().__init__(dims, mode)
        if not 1 <= summary <= stride:
            raise ConfigError(f"attention=fixed: summary={summary} (c) must lie between 1 and "
                              f"stride={stride} (l)")
        self.stride, self.summary = stride, summary

    def width(self, s: int) -> int:
        return self.stride

    def parts(self, width: int, merged: bool) -> tuple[tuple[Part, ...], tuple[Part, ...]]:
        return (Blocks(width),), (Summary(width, self.summary, skip_own_row=merged),)
