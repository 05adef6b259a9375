"""DeltaNet: the delta rule of Schlag, Irie & Schmidhuber 2021, "Linear Transformers Are Secretly
Fast Weight Programmers" (ICML), in the architecture and chunkwise-parallel form of Yang, Wang,
Zhang, Shen & Kim 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length" (NeurIPS).  Per head, with H = ``model.n_heads`` heads of Dk = ``expand_k`` d / H key
and Dv = ``expand_v`` d / H value channels:

    [q_t; k_t; v_t] = SiLU(ShortConv(W x)_t),    q_t, k_t <- q_t / |q_t|, k_t / |k_t|,
    beta_t = sigmoid(W_beta x_t),
    S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,    o_t = S_t q_t / sqrt(Dk),
    y_t = W_O [RMSNorm(o_t) (* SiLU(W_g x_t) with ``use_gate``)]_heads,

ShortConv a causal depth-wise convolution of width ``conv_size`` over the q/k/v channels (the
2024 paper's section 3.4 architecture: L2-normalised SiLU features, short convolutions, an output
norm; fla's ``DeltaNet`` layer, its authors' code: no output gate, no biases, the norm's eps
1e-6 of fla's ``DeltaNetConfig``).  The recurrence runs chunked (Yang et al. 2024's WY form,
:mod:`xformer_bench.attention._ops.delta_rule`, ``chunk_size`` positions at a time, O(T) memory);
on CUDA with fla installed, fla's kernels.  The 1/sqrt(Dk) query scale is fla's default.

Causal only (the papers define no bidirectional form); any length.  Key padding: a padded
position's projected inputs are zeroed before the convolution and its beta set to 0, so it
neither writes the state nor reaches a later position's q/k/v.  Incremental decoding keeps
(S, the last conv_size - 1 convolution inputs) per layer: O(1) per token.  No additive position
bias and no rotary (there are no attention logits).

Deviations: H follows ``model.n_heads`` (the 2024 paper's 1.3B model: 16 heads of 128 at
d = 2048); the linear layers take the model-wide initialisation (fla: N(0, 0.02)).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.delta_rule import delta_rule
from xformer_bench.attention._ops.short_conv import causal_depthwise
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.core.init import mark_initialised
from xformer_bench.errors import ConfigError
from xformer_bench.norm.rmsnorm import RMSNorm
from xformer_bench.registry import ATTENTION


def head_width(option: str, key: str, expand: float, dims: ModelDims) -> int:
    """``expand`` d_model channels split over the heads: per-head width, checked whole."""
    total = expand * dims.d_model
    if expand <= 0 or total != int(total) or int(total) % dims.n_heads:
        raise ConfigError(f"attention.{key}={expand}: attention={option} needs {key} x "
                          f"model.d_model={dims.d_model} to be a whole multiple of "
                          f"model.n_heads={dims.n_heads}")
    return int(total) // dims.n_heads


def short_conv(x: torch.Tensor, weight: torch.Tensor,
               past: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depth-wise convolution then SiLU: x (B, T, C), weight (C, K), ``past`` the K - 1
    inputs before x (None: zeros).  Returns (B, T, C) and the last K - 1 inputs."""
    width = weight.shape[-1]
    full = F.pad(x, (0, 0, width - 1, 0)) if past is None else torch.cat([past.to(x.dtype), x], 1)
    y = causal_depthwise(full, weight)
    return F.silu(y), full[:, full.shape[1] - (width - 1):]


@ATTENTION.register("deltanet")
class DeltaNet(TokenMixer):
    provides = frozenset({"causal", "key_padding_mask", "variable_length"})
    sub_quadratic = True
    decode_state = "recurrent"
    option = "deltanet"
    beta_bias = False  # fla's DeltaNet: b_proj without bias

    def __init__(self, dims: ModelDims, expand_k: float = 1.0, expand_v: float = 1.0,
                 conv_size: int = 4, use_gate: bool = False, norm_eps: float = 1e-6,
                 chunk_size: int = 64):
        super().__init__()
        for key, value in (("conv_size", conv_size), ("chunk_size", chunk_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"attention.{key}={value!r} must be a positive integer")
        self.heads = dims.n_heads
        self.dk = head_width(self.option, "expand_k", expand_k, dims)
        self.dv = head_width(self.option, "expand_v", expand_v, dims)
        self.chunk_size = chunk_size
        key_dim, value_dim = self.heads * self.dk, self.heads * self.dv
        self.qkv = nn.Linear(dims.d_model, 2 * key_dim + value_dim, bias=False)
        self.beta = nn.Linear(dims.d_model, self.heads, bias=self.beta_bias)
        if self.beta.bias is not None:  # zero, as fla's _init_weights leaves every Linear bias
            nn.init.zeros_(self.beta.bias)
            mark_initialised(self.beta.bias)
        # depth-wise (C, K) kernel, nn.Conv1d's default init (fla's ShortConvolution), no bias
        bound = 1 / math.sqrt(conv_size)
        self.conv = nn.Parameter(torch.empty(2 * key_dim + value_dim, conv_size).uniform_(
            -bound, bound))
        self.gate = nn.Linear(dims.d_model, value_dim, bias=False) if use_gate else None
        self.norm = RMSNorm(self.dv, eps=norm_eps)  # one gain per value channel, shared by heads
        self.out = nn.Linear(value_dim, dims.d_model, bias=False)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor | None:
        """log alpha_t (B, T, H); None: no decay (DeltaNet)."""
        return None

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        t = x.shape[1]
        slot = ctx.cache.slot() if ctx.cache is not None else None
        memory, past = slot.get("state", (None, None)) if slot is not None else (None, None)
        pad = None if ctx.key_padding_mask is None else ctx.key_padding_mask[:, -t:, None]
        h = self.qkv(x)  # (B, T, 2 H Dk + H Dv)
        if pad is not None:
            h = h.masked_fill(pad, 0.0)
        h, past = short_conv(h, self.conv, past)
        q, k, v = h.split([self.heads * self.dk, self.heads * self.dk, self.heads * self.dv], -1)
        q, k = (F.normalize(z.unflatten(-1, (self.heads, self.dk)).float(), dim=-1, eps=1e-6)
                for z in (q, k))  # (B, T, H, Dk)
        v = v.unflatten(-1, (self.heads, self.dv))  # (B, T, H, Dv)
        beta = self.beta(x).float().sigmoid()  # (B, T, H)
        log_alpha = self.log_decay(x)
        if pad is not None:  # a padded position writes nothing and decays nothing
            beta = beta.masked_fill(pad, 0.0)
            log_alpha = None if log_alpha is None else log_alpha.masked_fill(pad, 0.0)
        o, memory = delta_rule(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), beta.transpose(1, 2),
            None if log_alpha is None else log_alpha.transpose(1, 2), scale=self.dk ** -0.5,
            chunk_size=self.chunk_size, initial_state=memory)  # (B, H, T, Dv)
        o = self.norm(o.transpose(1, 2))  # (B, T, H, Dv)
        if self.gate is not None:
            o = o * F.silu(self.gate(x)).unflatten(-1, (self.heads, self.dv))
        if slot is not None:
            slot["state"] = (memory, past)
        return self.out(o.flatten(-2))
