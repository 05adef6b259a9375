"""Gated linear attention: Yang, Wang, Shen, Panda & Kim 2024, "Gated Linear Attention
Transformers with Hardware-Efficient Training" (ICML), sections 4.1 and 4.4.

Per head, with a data-dependent decay for every key dimension (the GLA layer of section 4.4):

    q_t = x_t W_Q,  k_t = x_t W_K,  v_t = x_t W_V,          W_Q, W_K: d x d_k,  W_V: d x d_v,
    alpha_t = sigmoid(x_t W_a1 W_a2 + b_a)^(1/tau),         W_a1: d x 16,  W_a2: 16 x d_k,
    S_t = diag(alpha_t) S_{t-1} + k_t^T v_t,   o_t = q_t S_t / sqrt(d_k / H),
    r_t = swish(x_t W_r + b_r),   y_t = (r_t * concat_h LN(o_t^h)) W_O,

with d_k = d/2, d_v = d, H = 4 heads, a rank-16 gate and the temperature tau = 16 that keeps the
forget rate slow (section 4.4; fla's ``gate_logit_normalizer``: log alpha = logsigmoid(.) / 16).
The decay per key dimension is what sets GLA apart from RetNet (fixed per head) and Mamba-2 (per
head and position); the shared engine (:mod:`~xformer_bench.attention._ops.gated_linear`)
keeps an (n, n, d_k / H) decay tensor per chunk in log space, so chunks are short (16: fla's
kernels use 64-position chunks whose 16-position sub-chunks are computed in log space, the same
split); fla's ``chunk_gla`` on CUDA.  The per-head LN has a gain and bias per channel
(GroupNorm with H groups; fla: an RMSNorm shared by the heads), eps 1e-5 (fla's ``norm_eps``).

Deviations: the projections take the model's initialisation (W_O is ``out``), and the gate's
bias b_a starts at 0 (so alpha starts near 0.5^(1/16) = 0.958), as in fla.  The paper's LLaMA
block (SwiGLU feed-forward, RMSNorm) is the model's choice.

Causal only (the paper defines no bidirectional form); any length; a padded position neither
writes nor decays the state.  Decoding keeps the state (B, H, d_k/H, d_v/H).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.gated_linear import GroupNorm, gated_linear
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.errors import ConfigError
from xformer_bench.registry import ATTENTION


@ATTENTION.register("gla")
class GatedLinearAttention(TokenMixer):
    provides = frozenset({"causal", "key_padding_mask", "variable_length"})
    sub_quadratic = True
    decode_state = "recurrent"

    def __init__(self, dims: ModelDims, n_heads: int = 4, expand_k: float = 0.5,
                 expand_v: float = 1.0, gate_low_rank: int = 16, gate_temperature: float = 16.0,
                 chunk_size: int = 16, eps: float = 1e-5):
        super().__init__()
        d = dims.d_model
        d_k, d_v = int(d * expand_k), int(d * expand_v)
        if not d_k or not d_v or d_k % n_heads or d_v % n_heads:
            raise ConfigError(f"attention=gla: d_k = {d_k} and d_v = {d_v} (d_model x "
                              f"expand_k, expand_v) must split into n_heads={n_heads} heads")
        if chunk_size < 1 or gate_temperature <= 0:
            raise ConfigError("attention=gla: chunk_size and gate_temperature must be positive")
        self.heads, self.chunk_size, self.temperature = n_heads, chunk_size, gate_temperature
        self.scale = (d_k // n_heads) ** -0.5
        self.q, self.k = nn.Linear(d, d_k, bias=False), nn.Linear(d, d_k, bias=False)
        self.v = nn.Linear(d, d_v, bias=False)
        self.gate_down = nn.Linear(d, gate_low_rank, bias=False)  # W_a1
        self.gate_up = nn.Linear(gate_low_rank, d_k)  # W_a2, b_a
        self.r = nn.Linear(d, d_v)  # the output gate's W_r, b_r
        self.norm = GroupNorm(d_v, n_heads, eps=eps)
        self.out = nn.Linear(d_v, d, bias=False)  # W_O

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        if not ctx.causal:
            raise ConfigError("attention=gla is causal only (the paper defines no "
                              "bidirectional form)")
        slot = ctx.cache.slot() if ctx.cache is not None else None  # decoding: this layer's
        state = None if slot is None else slot.get("state")  # None at the first step

        def heads(y):  # (B, T, H * W) -> (B, H, T, W)
            return y.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        log_alpha = F.logsigmoid(self.gate_up(self.gate_down(x)).float()) / self.temperature
        o, state = gated_linear(heads(self.q(x)), heads(self.k(x)), heads(self.v(x)),
                                heads(log_alpha), scale=self.scale, chunk=self.chunk_size,
                                state=state, keep_state=slot is not None,
                                key_padding_mask=ctx.key_padding_mask)  # (B, H, T, d_v/H)
        if slot is not None:
            slot["state"] = state
        y = self.norm(o.transpose(1, 2).flatten(2))  # (B, T, d_v)
        return self.out(F.silu(self.r(x)) * y)
