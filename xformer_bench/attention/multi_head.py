"""Multi-head attention: the default token mixer, the q/k/v and output projections around a
pluggable :class:`~xformer_bench.attention.AttentionKernel`.

``n_kv_heads`` below ``n_heads`` shares each key/value head among ``n_heads / n_kv_heads``
query heads: multi-query attention at 1 (Shazeer 2019), grouped-query attention between
(Ainslie et al. 2023).  The projections stay one fused matrix, queries first, then keys, then
values; the kernel sees every query head with its key/value head.

With memory (``ctx.attention_memory``, (B, M, D): Transformer-XL's previous segment, already
normalised) keys and values are projected from ``[memory; x]`` and queries from ``x`` alone:
S = M + T keys, the queries the last T of them (the kernels' and positions' convention).

With a key/value cache (``ctx.cache``, incremental decoding; :mod:`xformer_bench.core.decode_cache`)
the T new positions follow ``ctx.cache.start`` cached ones: queries and keys are rotated there,
the keys and values (still H_kv heads) appended to the cache, and the queries attend over all
S = start + T of them, again as the last T.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import AttentionKernel, TokenMixer
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims


class MultiHeadAttention(TokenMixer):
    def __init__(self, dims: ModelDims, kernel: AttentionKernel, n_kv_heads: int | None = None):
        super().__init__()
        self.n_heads = dims.n_heads
        self.n_kv_heads = n_kv_heads or dims.n_heads
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        self.head_dim = dims.head_dim
        self.qkv = nn.Linear(dims.d_model, (self.n_heads + 2 * self.n_kv_heads) * self.head_dim)
        self.out = nn.Linear(dims.d_model, dims.d_model)
        self.kernel = kernel
        self.provides = kernel.provides | {"queries_and_keys"}
        self.sub_quadratic = kernel.sub_quadratic

    @property
    def decode_state(self) -> str:
        """``keys_values`` when the kernel attends causally over more keys than queries, by
        absolute position; else ``none``.  A subclass that changes the scores says ``none``."""
        cacheable = {"causal", "longer_keys"} <= self.provides
        return "keys_values" if cacheable and self.kernel.decodes_by_position else "none"

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, T, Dh), keys and values (B, H_kv, T, Dh) of ``x`` (B, T, D)."""
        b, t, _ = x.shape
        heads = (self.n_heads, self.n_kv_heads, self.n_kv_heads)
        q, k, v = self.qkv(x).split([h * self.head_dim for h in heads], dim=-1)  # (B, T, h*Dh)
        return tuple(y.view(b, t, h, self.head_dim).transpose(1, 2) for y, h in zip((q, k, v), heads))

    def project_keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, H_kv, M, Dh) of ``memory`` (B, M, D): no queries computed."""
        b, m, _ = memory.shape
        n_query = self.n_heads * self.head_dim
        bias = None if self.qkv.bias is None else self.qkv.bias[n_query:]
        kv = F.linear(memory, self.qkv.weight[n_query:], bias)  # (B, M, 2 H_kv Dh)
        k, v = kv.view(b, m, 2 * self.n_kv_heads, self.head_dim).transpose(1, 2).chunk(2, dim=1)
        return k, v

    def share_kv_heads(self, y: torch.Tensor) -> torch.Tensor:  # (B, H_kv, S, Dh) -> (B, H, S, Dh)
        group = self.n_heads // self.n_kv_heads
        return y if group == 1 else y.repeat_interleave(group, dim=1)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        y = self.heads(x, ctx)  # (B, H, T, Dh)
        return self.out(y.transpose(1, 2).flatten(2))  # (B, T, D)

    def heads(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """Every head's attention output (B, H, T, Dh) over ``x`` (B, T, D), before the output
        projection."""
        t = x.shape[1]
        q, k, v = self.project(x)
        if ctx.cache is not None:  # decoding: new positions start .. start + T - 1
            q, k = ctx.position.rotate_from(q, k, ctx.cache.start)
            k, v = ctx.cache.extend(k, v)  # cached and new: (B, H_kv, start + T, Dh)
        else:
            if ctx.attention_memory is not None:  # keys, values of [memory; x]: (B, H_kv, M + T, Dh)
                k_memory, v_memory = self.project_keys_values(ctx.attention_memory)
                k, v = torch.cat([k_memory, k], dim=2), torch.cat([v_memory, v], dim=2)
            q, k = ctx.position.rotate(q, k)  # queries at key positions S - T .. S - 1
        k, v = self.share_kv_heads(k), self.share_kv_heads(v)  # (B, H, S, Dh) each
        s = k.shape[2]
        keys = {"key": k} if ctx.position.reads_keys else {}
        bias = ctx.position.bias(t, s, layer=ctx.layer, query=q, **keys)  # lazy PairBias or None
        return self.kernel(q, k, v, causal=ctx.causal, bias=bias,
                           key_padding_mask=ctx.key_padding_mask, layer=ctx.layer)  # (B, H, T, Dh)
