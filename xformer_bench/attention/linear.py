"""Linear attention: Katharopoulos, Vyas, Pappas & Fleuret 2020, "Transformers are RNNs: Fast
Autoregressive Transformers with Linear Attention" (ICML).

The softmax similarity is replaced by a kernel phi(q)^T phi(k) with the feature map of
section 3.2, phi(x) = elu(x) + 1 (positive, so the normaliser never vanishes), and the
products are reassociated (eq. 4-6):

    out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j) + eps),

the sums running over every key (bidirectional) or over j <= i (causal, eq. 8-9: the prefix
sums S_i, z_i of section 3.3, the RNN of section 3.4).  O(T Dh^2) time, no T x T matrix.
The prefix sums are computed in chunks of ``chunk_size`` positions, carrying the running
(Dh, Dh) state and normaliser between chunks, exact within a chunk through a (chunk x chunk)
masked product (:func:`~xformer_bench.attention._ops.feature_maps.feature_attention`): the
paper computes them one position at a time in a CUDA kernel; the chunking is ours and changes
only the order of the additions.  eps = 1e-6 as in the authors' ``fast_transformers``.

Padded keys get zero features (they add nothing); additive position biases cannot enter a
kernel sum and are not supported (rotary positions work: they rotate q and k before phi).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.feature_maps import feature_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


def elu_feature_map(x: torch.Tensor) -> torch.Tensor:
    """phi(x) = elu(x) + 1 (Katharopoulos et al. 2020, eq. 7)."""
    return F.elu(x) + 1


@ATTENTION.register("linear")
class LinearAttention(AttentionKernel):
    provides = frozenset({"causal", "bidirectional", "longer_keys", "key_padding_mask",
                          "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, chunk_size: int = 64, eps: float = 1e-6):
        super().__init__()
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be positive")
        self.chunk_size, self.eps = chunk_size, eps

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
        if bias is not None:
            raise ValueError("linear attention cannot add a pair bias")
        return feature_attention(elu_feature_map(q), elu_feature_map(k), v, causal=causal,
                                 chunk=self.chunk_size, eps=self.eps,
                                 key_padding_mask=key_padding_mask)
