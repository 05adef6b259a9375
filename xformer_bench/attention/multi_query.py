"""Multi-query attention (Shazeer 2019, "Fast Transformer Decoding: One Write-Head is All You
Need"): every query head attends with one shared key head and one shared value head,

    head_i = Attention(x W^Q_i, x W^K, x W^V),

which cuts the key/value projections from H heads to one (2 (H - 1) Dh D fewer weights, and as
many fewer biases) and an incremental decoder's key/value cache by a factor H -- the paper's
point, memory bandwidth at decoding.  It is grouped-query attention with one group (see
:mod:`xformer_bench.attention.grouped_query`); the kernel is full softmax attention.
"""

from __future__ import annotations

from xformer_bench.attention import TokenMixer
from xformer_bench.attention.grouped_query import shared_kv_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION


@ATTENTION.register("multi_query")
def build(dims: ModelDims, dropout: float = 0.0) -> TokenMixer:
    return shared_kv_attention(dims, n_kv_heads=1, dropout=dropout)
