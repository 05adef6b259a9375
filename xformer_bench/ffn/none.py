"""No feed-forward sublayer: the block is attention only.

The layer returns zeros, so the feed-forward residual branch adds nothing.  What the block then
does depends on the norm placement (``model.norm_placement``, see
:mod:`xformer_bench.models.block`):

* ``pre``      -- ``x + 0``: the block is exactly its attention sublayer;
* ``post``     -- ``N(x + 0) = N(x)``: a second norm right after the attention sublayer's
  ``N(x + attention(x))`` -- with learned gains, not quite the identity;
* ``sandwich`` -- ``x + N_output(0)``: for LayerNorm its learned bias (a constant vector added
  per block, 0 at initialisation), for RMSNorm and ScaleNorm 0.

The zeros are ``x * 0`` rather than a fresh tensor so that the parameters in front of the
branch (its input norm, a ReZero gate) stay in the autograd graph with a zero gradient instead
of none: DDP without ``find_unused_parameters`` requires every parameter to get a gradient.
The model-wide parameter and FLOP counts see no feed-forward layer.  Fixup is refused with this
option (it needs a residual output layer to zero, and there is none).

With ``attention=persistent_memory`` this is the all-attention network of Sukhbaatar et al.
2019 ("Augmenting Self-attention with Persistent Memory"), whose persistent key/value vectors
take the feed-forward layer's place.  The ``activation`` config is not used.
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import FFN


@FFN.register("none")
class NoFeedForward(nn.Module):
    def __init__(self, dims: ModelDims, activation: Mapping[str, Any]):
        super().__init__()

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        return x * 0  # (B, T, D) zeros, still attached to the graph
