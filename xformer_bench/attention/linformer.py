"""Linformer (Wang, Li, Khabsa, Fang & Ma 2020, "Linformer: Self-Attention with Linear
Complexity"): keys and values are projected along the sequence to ``k`` rows before the
softmax, so each head is

    head_i = softmax(Q_i (E_i K_i)^T / sqrt(Dh)) (F_i V_i),    E_i, F_i in R^{k x n}   (eq. 7)

-- a (T, k) attention matrix instead of (T, T): O(T k) time and memory.  n is fixed when the
model is built (``dims.seq_len``, i.e. ``data.seq_len``): a shorter input of S keys uses the
first S columns of E and F (as the authors' fairseq code does, ``compress_k.weight[:, :S]``),
a longer one is a one-line ``ConfigError``.

Sharing (section 4, "Additional Efficiency Techniques"):

* ``none`` -- E_i, F_i per head (the default);
* ``headwise`` -- one E and one F per layer, shared by its heads;
* ``key_value`` -- one matrix per layer, E = F, shared by keys, values and heads;
* ``layerwise`` -- one matrix for every layer: refused (``ConfigError``).  The model builds
  one kernel per layer, and a kernel cannot reach another layer's parameters without a
  registry shared between models (the class-level matrix of some reimplementations) -- which
  would tie independently built models together.  It needs a model-level change.

E and F are learned, initialised as in the authors' release (fairseq ``examples/linformer``):
Xavier-uniform with gain 1/sqrt(2) on each (k, n) matrix.  Default k = 256 (the larger of the
paper's two settings in Table 2, k = 128 and 256); with k >= n nothing is compressed but the
method is unchanged.  Default sharing ``none``, eq. 7 as written (fairseq's default shares
across heads: ``headwise``).

Bidirectional only: E mixes every position into every projected row, so a causal query would
see the future (``attention=linformer`` in the decoder LM is refused, one line).  Padded keys
are zeroed before the projection (keys and values), so they have no influence; the k
projected rows are still attended (a fully padded row averages zero values: 0).  Not
declared: ``additive_bias`` (a projected row has no key position to bias by).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION

SHARING = ("none", "headwise", "key_value", "layerwise")


def fairseq_init(weight: torch.Tensor) -> torch.Tensor:
    """Xavier-uniform with gain 1/sqrt(2) on each trailing (k, n) matrix (fairseq Linformer)."""
    k, n = weight.shape[-2:]
    bound = math.sqrt(6 / (k + n)) / math.sqrt(2)
    with torch.no_grad():
        return weight.uniform_(-bound, bound)


def project(weight: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """E x along the sequence: weight (H|1, k, n), x (B, H, S, Dh), S <= n -> (B, H, k, Dh)."""
    s = x.shape[-2]
    weight = (weight if s == weight.shape[-1] else weight[..., :s]).to(x.dtype)  # (H|1, k, S)
    if weight.shape[0] == 1:  # shared by the heads: one (k, S) x (S, B H Dh) product
        return torch.einsum("ks,bhsd->bhkd", weight[0], x)
    return torch.einsum("hks,bhsd->bhkd", weight, x)


@ATTENTION.register("linformer")
class LinformerAttention(AttentionKernel):
    provides = frozenset({"bidirectional", "longer_keys", "key_padding_mask", "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, k: int = 256, sharing: str = "none"):
        super().__init__()
        if sharing not in SHARING:
            raise ConfigError(f"attention.sharing={sharing!r}: choose one of {', '.join(SHARING)}")
        if sharing == "layerwise":
            raise ConfigError("attention=linformer: sharing=layerwise needs one projection shared "
                              "by every layer, which a kernel built per layer cannot hold; "
                              "choose none, headwise or key_value")
        if k < 1:
            raise ConfigError(f"attention=linformer: k={k} must be positive")
        self.k, self.sharing, self.max_len = k, sharing, dims.seq_len
        heads = dims.n_heads if sharing == "none" else 1
        self.E = nn.Parameter(fairseq_init(torch.empty(heads, k, dims.seq_len)))  # (H|1, k, n)
        self.F = (self.E if sharing == "key_value"
                  else nn.Parameter(fairseq_init(torch.empty(heads, k, dims.seq_len))))

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
        if causal or bias is not None:
            raise ValueError("attention=linformer is bidirectional and takes no additive bias")
        s = k.shape[-2]
        if s > self.max_len:
            raise ConfigError(f"attention=linformer: {s} keys exceed the projection length "
                              f"n={self.max_len} (data.seq_len when built); build with a longer "
                              "data.seq_len")
        if key_padding_mask is not None:
            padded = key_padding_mask[:, None, :, None]  # (B, 1, S, 1)
            k, v = k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)
        keys, values = project(self.E, k), project(self.F, v)  # (B, H, k, Dh) each
        return F.scaled_dot_product_attention(q, keys, values)  # (B, H, T, Dh)
