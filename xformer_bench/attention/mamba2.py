"""Mamba-2: Dao & Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms
Through Structured State Space Duality" (ICML), the SSD layer (section 7) in the Mamba-2 block
(section 7.1, Figure 6), with the authors' ``mamba_ssm`` ``Mamba2`` module's defaults.

One input projection gives, per position, the gate z, the SSM input x (d_inner = expand d
channels, H = d_inner / P heads of P = ``head_dim``), B and C (G groups of N = ``d_state``)
and dt (one per head).  Then

    [x, B, C] = silu(causal depthwise conv_w([x, B, C]))       (w = ``d_conv`` taps, bias)
    dt_t = softplus(dt_t + dt_bias),   A_h = -exp(A_log_h)     (a scalar per head)
    h_t = exp(dt_t A_h) h_{t-1} + dt_t B_t^T x_t,   y_t = C_t h_t + D_h x_t   (h: N x P per head)
    out = W_out RMSNorm_G(y * silu(z))                        (norm after the gate, G groups)

The SSD recurrence is linear attention with a data-dependent scalar decay per head and position
(section 4: q = C, k = B, v = dt x, log-decay dt A, no scale), computed by the shared chunked
engine (:mod:`~xformer_bench.attention._ops.gated_linear`; fla's ``chunk_simple_gla`` on
CUDA).  Heads of group g read B, C of group g (G = ``n_groups``, 1: shared by all heads, the
multi-value form of section 7.2).  Initialisation as ``mamba_ssm``: A uniform in [1, 16], dt
log-uniform in [0.001, 0.1] (floor 1e-4) through the inverse softplus of dt_bias, D = 1, the
convolution at PyTorch's default, the norm's gain 1; the projections (no biases) take the model's
initialisation (``out`` is W_out).  A_log, dt_bias and D get no weight decay (vectors), as there.

Deviations: ``mamba_ssm``'s fused kernels (conv + scan + norm + projection) are one computation
here in several ops; no ``dt_limit`` clamp (its default is none).

Causal only (the paper's SSD is causal); any length; a padded position neither feeds the
convolution (its input is zeroed) nor writes or decays the state.  Decoding keeps the state
(B, H, N, P) and the convolution's last w - 1 inputs.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.gated_linear import GroupNorm, gated_linear
from xformer_bench.attention._ops.short_conv import causal_depthwise
from xformer_bench.attention._ops.token_mlp import drop_padding
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.errors import ConfigError
from xformer_bench.registry import ATTENTION


def dt_bias_init(n_heads: int, dt_min: float, dt_max: float, floor: float) -> torch.Tensor:
    """softplus^-1 of dt drawn log-uniform in [dt_min, dt_max], at least ``floor``."""
    dt = torch.exp(torch.rand(n_heads) * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min))
    dt = dt.clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))


@ATTENTION.register("mamba2")
class Mamba2(TokenMixer):
    provides = frozenset({"causal", "key_padding_mask", "variable_length"})
    sub_quadratic = True
    decode_state = "recurrent"

    def __init__(self, dims: ModelDims, expand: int = 2, head_dim: int = 64, d_state: int = 128,
                 n_groups: int = 1, d_conv: int = 4, chunk_size: int = 256,
                 a_init_range: tuple[float, float] = (1.0, 16.0), dt_min: float = 0.001,
                 dt_max: float = 0.1, dt_init_floor: float = 1e-4, eps: float = 1e-5):
        super().__init__()
        d_inner = expand * dims.d_model
        if d_inner % head_dim or (d_inner // head_dim) % n_groups:
            raise ConfigError(f"attention=mamba2: d_inner = expand x d_model = {d_inner} must "
                              f"split into heads of head_dim={head_dim}, a multiple of "
                              f"n_groups={n_groups} of them")
        if min(d_state, d_conv, chunk_size) < 1:
            raise ConfigError("attention=mamba2: d_state, d_conv and chunk_size must be positive")
        lo, hi = a_init_range
        if not 0 < lo <= hi or not 0 < dt_min <= dt_max:
            raise ConfigError("attention=mamba2: need 0 < a_init_range[0] <= a_init_range[1] "
                              "and 0 < dt_min <= dt_max")
        self.heads, self.groups, self.chunk_size = d_inner // head_dim, n_groups, chunk_size
        self.sizes = [d_inner, d_inner + 2 * n_groups * d_state, self.heads]  # z, xBC, dt
        self.in_proj = nn.Linear(dims.d_model, sum(self.sizes), bias=False)
        channels = self.sizes[1]
        self.conv = nn.Conv1d(channels, channels, d_conv, groups=channels)  # depthwise, bias
        self.dt_bias = nn.Parameter(dt_bias_init(self.heads, dt_min, dt_max, dt_init_floor))
        self.A_log = nn.Parameter(torch.empty(self.heads).uniform_(lo, hi).log())
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GroupNorm(d_inner, n_groups, eps=eps, rms=True)
        self.out = nn.Linear(d_inner, dims.d_model, bias=False)

    def convolve(self, xbc: torch.Tensor, tail: torch.Tensor | None):
        """The causal depthwise convolution of xBC (B, T, C) after ``tail`` (B, w - 1, C), the
        inputs before it (None: zeros); returns silu(conv) (B, T, C) and the new tail."""
        width = self.conv.kernel_size[0]
        inputs = F.pad(xbc, (0, 0, width - 1, 0)) if tail is None else torch.cat([tail, xbc], 1)
        y = causal_depthwise(inputs, self.conv.weight[:, 0], self.conv.bias)
        return F.silu(y), inputs[:, inputs.shape[1] - (width - 1):]

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        if not ctx.causal:
            raise ConfigError("attention=mamba2 is causal only (the paper's SSD is causal)")
        slot = ctx.cache.slot() if ctx.cache is not None else None  # decoding: this layer's
        state = {} if slot is None else slot.get("state", {})  # empty at the first step
        z, xbc, dt = self.in_proj(x).split(self.sizes, dim=-1)
        xbc, tail = self.convolve(drop_padding(xbc, ctx.key_padding_mask), state.get("conv"))
        xs, b, c = xbc.split([self.sizes[0], *(2 * [(self.sizes[1] - self.sizes[0]) // 2])], -1)

        def heads(y, n):  # (B, T, n * W) -> (B, H, T, W), n of the H heads' blocks
            y = y.unflatten(-1, (n, -1)).transpose(1, 2)  # (B, n, T, W)
            return y.repeat_interleave(self.heads // n, dim=1) if n < self.heads else y

        dt = F.softplus(dt.float() + self.dt_bias).transpose(1, 2)[..., None]  # (B, H, T, 1)
        log_decay = -torch.exp(self.A_log.float())[:, None, None] * dt  # dt A: (B, H, T, 1)
        xh = heads(xs, self.heads)  # (B, H, T, P)
        y, ssm = gated_linear(heads(c, self.groups), heads(b, self.groups), xh * dt, log_decay,
                              scale=1.0, chunk=self.chunk_size, state=state.get("ssm"),
                              keep_state=slot is not None, key_padding_mask=ctx.key_padding_mask)
        if slot is not None:
            slot["state"] = {"conv": tail, "ssm": ssm}
        y = y + xh * self.D[:, None, None].to(xh.dtype)  # the D skip, (B, H, T, P)
        y = self.norm(y.transpose(1, 2).flatten(2) * F.silu(z))  # (B, T, d_inner)
        return self.out(y)
