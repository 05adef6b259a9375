"""Grouped-query attention (Ainslie, Lee-Thorp, de Jong, Zemlyanskiy, Lebron & Sanghai 2023,
"GQA: Training Generalized Multi-Query Transformer Models from Multi-Head Checkpoints").

The H query heads are split into G = ``n_kv_heads`` groups; the heads of a group share one key
head and one value head:

    head_i = Attention(x W^Q_i, x W^K_{g(i)}, x W^V_{g(i)}),    g(i) = floor(i / (H / G)),

so the key and value projections shrink from H to G heads (2 (H - G) Dh D fewer weights, and
as many fewer biases, counted in the record's params) and so does an incremental decoder's
key/value cache.  G = 1 is multi-query attention (``attention=multi_query``), G = H multi-head
attention.  The projections and the head sharing live in
:class:`~xformer_bench.attention.multi_head.MultiHeadAttention`; the kernel is full softmax
attention.

The paper's models use G = 8 (GQA-8, for T5 XXL's 64 heads).  The default here is
``n_kv_heads: 2``, a value that divides the head counts of the small models this benchmark
trains (2, 4, 12); set it to 8 for the paper's setting at 8 or more heads.  The paper's uptraining
from a multi-head checkpoint (mean-pooling each group's key/value heads) is not done: models
are trained from scratch with G heads.
"""

from __future__ import annotations

from xformer_bench.attention import TokenMixer
from xformer_bench.attention.full import FullAttention
from xformer_bench.errors import ConfigError
from xformer_bench.attention.multi_head import MultiHeadAttention
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION


def shared_kv_attention(dims: ModelDims, n_kv_heads: int, dropout: float) -> TokenMixer:
    """Full attention whose ``n_kv_heads`` key/value heads are shared by groups of query heads."""
    if not 1 <= n_kv_heads <= dims.n_heads or dims.n_heads % n_kv_heads:
        raise ConfigError(f"attention.n_kv_heads={n_kv_heads} must divide "
                          f"model.n_heads={dims.n_heads}")
    return MultiHeadAttention(dims, FullAttention(dims, dropout=dropout), n_kv_heads=n_kv_heads)


@ATTENTION.register("grouped_query")
def build(dims: ModelDims, n_kv_heads: int = 2, dropout: float = 0.0) -> TokenMixer:
    return shared_kv_attention(dims, n_kv_heads, dropout)
