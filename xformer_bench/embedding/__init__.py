"""Token embeddings: (B, T) token ids -> (B, T, D) vectors.  Builders take ``vocab_size`` and
``d_model`` plus the keys of their YAML (``conf/embedding/<name>.yaml``).

A tied output head (``head.tie``) reads an embedding's tables through :meth:`Embedding.tables`:
``(first id, table)`` per cluster of the vocabulary -- one cluster for ``lookup`` and
``factorized``, one per frequency band for ``adaptive_input``.

Scale.  Vaswani et al. (2017, section 3.4) multiply the embeddings by sqrt(D) and add
sinusoids of amplitude 1, so tokens and positions have unit scale.  xbench keeps that ratio
but divides the whole input by sqrt(D): tables are not multiplied, and the sinusoidal
positions are divided by sqrt(D) (``position/sinusoidal.py``).  In a pre-LN stack the initial
scale of the residual stream decides how much the first updates of the blocks change it: at
unit scale the blocks' contributions started ~30x smaller than the stream, and on real text
(d_model 256, 4 layers, 400 steps) the model ended 0.15 bits per byte behind the same
model with a D^-1/2 stream.  Every option's token vectors start at RMS D^-1/2: a table of width
E is N(0, 1/E) and a projection E -> D is N(0, 1/D), so each output coordinate has variance
E * (1/E) * (1/D) = 1/D (a table of width D is N(0, 1/D) and has no projection).  The tied
output head then starts with unit-scale logits.
"""

from __future__ import annotations

from torch import nn

from xformer_bench.core.init import mark_initialised


class Embedding(nn.Module):
    """An embedding whose tables a tied output head may share."""

    def tables(self) -> list[tuple[int, nn.Embedding]]:
        """``(first token id, table)`` of each cluster, in id order."""
        raise NotImplementedError


def init_table(layer: nn.Embedding) -> nn.Embedding:
    """``layer`` (n_tokens x width) re-drawn N(0, 1/width), the house scale (above)."""
    nn.init.normal_(layer.weight, std=layer.embedding_dim ** -0.5)
    mark_initialised(layer.weight)
    return layer


def init_projection(layer: nn.Linear) -> nn.Linear:
    """``layer`` (width -> D) re-drawn N(0, 1/D), the house scale (above)."""
    nn.init.normal_(layer.weight, std=layer.out_features ** -0.5)
    mark_initialised(layer.weight)
    return layer
