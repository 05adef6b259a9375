"""Transformer-XL's relative position encoding (Dai, Yang, Yang, Carbonell, Le & Salakhutdinov
2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length Context", ACL, section
3.3).  The logit of query i and key j is

    A_ij = q_i . k_j  (a)  +  q_i . W_{k,R} R_{i-j}  (b)  +  u . k_j  (c)  +  v . W_{k,R} R_{i-j}  (d)

with R_{i-j} the sinusoid (Vaswani et al. 2017) of the relative distance i - j, D wide and not
learned, W_{k,R} a learned D x D projection per layer split into the H heads, and u, v learned
vectors of Dh per head.  Every term is scaled by 1/sqrt(Dh) like q . k.  The attention kernel
computes (a); this scheme is the additive bias (b) + (c) + (d), lazy like the house's others:

* (b) + (d) = (q_i + v) . W_{k,R} R_{i-j}: one product per query and *distance* (the paper's
  per-distance matmul, O(T (S + T)), never a T x S x Dh gather), looked up per (i, j) pair;
* (c) = u . k_j: one number per key, the same for every query (the keys come as ``key=``, so
  the scheme declares ``reads_keys``).

Nothing is added to the token embeddings.  Queries are the last T of the S keys (with memory,
the memory comes first), so the distances run from -(T - 1) (a key after the query: only
bidirectional attention reaches it, the sinusoid of a negative distance is used as is) to S - 1.

Choices: u and v are shared by all layers as in the paper (``shared_biases: false``: a pair per
layer); R is the authors' code's ``[sin, cos]`` concatenation (any order is the same model under a
learned W_{k,R}); W_{k,R} starts N(0, SmallInit) like the house's other projections, u and v
N(0, 0.02) as in the authors' code.  An attention layer that computes its own logits without
passing the keys (``model.residual_attention``, the synthesizer's mix) gets (b) + (d) only.
"""

from __future__ import annotations

import math

import torch

from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import small_init_std
from xformer_bench.position import LayerwiseTable, PairBias, Position
from xformer_bench.registry import POSITION


def relative_sinusoid(distance: torch.Tensor, d: int, base: float = 10000.0) -> torch.Tensor:
    """R of the paper: ``[sin(distance * f), cos(distance * f)]``, ``f_p = base^(-2p / d)``;
    ``distance`` (N,) any integers, returns (N, d) float32."""
    inverse_frequency = base ** (-torch.arange(0, d, 2, device=distance.device).float() / d)  # (d/2,)
    angles = distance.float()[:, None] * inverse_frequency  # (N, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)  # (N, d)


@POSITION.register("xl_relative")
class XLRelativePosition(Position):
    requires = {"attention": frozenset({"additive_bias"})}
    reads_keys = True

    def __init__(self, dims: ModelDims, shared_biases: bool = True, base: float = 10000.0,
                 bias_init_std: float = 0.02):
        super().__init__()
        if dims.d_model % 2:
            raise ValueError(f"position=xl_relative needs an even model.d_model, got {dims.d_model}")
        self.n_heads, self.head_dim, self.d_model, self.base = (
            dims.n_heads, dims.head_dim, dims.d_model, base)
        self.scale = 1.0 / math.sqrt(dims.head_dim)  # the same 1/sqrt(Dh) as q k^T
        self.key_projection = LayerwiseTable(  # W_{k,R}, per layer: (D, H Dh)
            dims.n_layers, False, (dims.d_model, dims.d_model), small_init_std(dims.d_model))
        head_vector = (dims.n_heads, dims.head_dim)
        self.u = LayerwiseTable(dims.n_layers, shared_biases, head_vector, bias_init_std)  # (H, Dh)
        self.v = LayerwiseTable(dims.n_layers, shared_biases, head_vector, bias_init_std)  # (H, Dh)

    def distance_keys(self, t_query: int, t_key: int, layer: int,
                      device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """W_{k,R} R_{i-j} for i - j = -(Tq - 1) .. Tk - 1, in that order: (H, Tq + Tk - 1, Dh)."""
        distance = torch.arange(-(t_query - 1), t_key, device=device)  # (N,)
        r = relative_sinusoid(distance, self.d_model, self.base).to(dtype)  # (N, D)
        projected = r @ self.key_projection(layer).to(dtype)  # (N, H Dh)
        return projected.view(-1, self.n_heads, self.head_dim).transpose(0, 1)  # (H, N, Dh)

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,  # (B, H, Tq, Dh)
        key: torch.Tensor | None = None,  # (B, H, Tk, Dh)
    ) -> PairBias:
        if query is None:
            raise ValueError("the 'xl_relative' position bias depends on the queries: pass query=")
        dtype = query.dtype
        per_distance_keys = self.distance_keys(t_query, t_key, layer, query.device, dtype)
        v = self.v(layer).to(dtype)[:, None, :]  # (H, 1, Dh)
        # terms (b) + (d): (B, H, Tq, N), per query and distance
        per_distance = (query + v) @ per_distance_keys.transpose(-1, -2) * self.scale
        per_key = None  # term (c): (B, H, Tk), per key
        if key is not None:
            per_key = (key @ self.u(layer).to(dtype)[:, :, None]).squeeze(-1) * self.scale

        def at(query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:  # (B, H, *S)
            row = (t_query - 1) - bias.distance(query_index, key_index)  # (i - j) + Tq - 1: S
            out = per_distance[:, :, query_index.expand_as(row), row]
            if per_key is not None:
                out = out + per_key[:, :, key_index.expand_as(row)]
            return out

        bias = PairBias(t_query, t_key, query.device, at)
        return bias
