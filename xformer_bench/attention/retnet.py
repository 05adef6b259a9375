"""Multi-scale retention: Sun, Dong, Huang, Ma, Xia, Xue, Wang & Wei 2023, "Retentive Network:
A Successor to Transformer for Large Language Models" (arXiv 2307.08621), section 2.

Per head h, over X (T, d), with Theta_n = e^{i n theta} (section 2.1):

    Q = (X W_Q) * Theta,   K = (X W_K) * conj(Theta),   V = X W_V,
    o_n = sum_{m <= n} gamma_h^{n-m} (Q_n . K_m / sqrt(Dk)) V_m          (parallel form)
        = Q_n S_n,   S_n = gamma_h S_{n-1} + K_n^T V_n / sqrt(Dk)          (recurrent form),
    gamma_h = 1 - 2^(-5-h),  h = 0 .. H-1,

and the gated multi-scale retention of section 2.2,

    Y = GroupNorm_H(concat_h o^h),   MSR(X) = (swish(X W_G) * Y) W_O.

Sizes (section 3.1's parameter allocation): W_Q, W_K d x d; W_V, W_G d x 2d; W_O 2d x d (the
layer ``out``; ``expand_v`` = 2, the width ``match_params: {by: mixer}`` re-solves).  Heads: the
paper's are 256 query/key dimensions wide (its 1.3B, 2.7B and 6.7B models: d = 2048, 2560, 4096
in 8, 10, 16 heads), but at our studies' d = 128, d / 256 leaves one head: one decay, 0.96875, a
fixed ~22-position window, not multi-scale retention.  So H = max(model.n_heads, d / head_dim):
the paper's 256-wide heads where d_model holds at least model.n_heads of them, else the model's
heads, d / n_heads wide (a deviation at small widths: 4 heads of 32, gamma 1 - 2^-5 .. 1 - 2^-8,
at d = 128 with 4 heads): ``n_heads: model``.  ``n_heads: null`` is the paper's rule alone
(d / head_dim, at least 1); an integer sets H.
Theta rotates pairs of dimensions (2p, 2p + 1) by n theta_p with theta_p = 10000^(-p / (Dk/2 - 1))
(the authors' torchscale, ``RetNetRelPos``); the xPos length-extrapolation factor is not applied,
as there: gamma takes its role.  The group norm is per head without a gain (torchscale:
LayerNorm(head, elementwise_affine=False)), eps 1e-6 (torchscale's ``layernorm_eps``).
Computed by the shared chunked engine (:mod:`~xformer_bench.attention._ops.gated_linear`, a
fixed log-decay log gamma_h per head; fla's ``chunk_simple_gla`` on CUDA).

Deviations: of section 2.2's three score normalisations only Q K^T / sqrt(Dk) is applied; the
other two divide each (position, head) row by a scalar, which the group norm removes (up to its
eps), as in fla's ``MultiScaleRetention``.  The projections take the model's initialisation
(torchscale: Xavier-uniform, gain 2^-2.5 for W_Q, W_K, W_V, W_G).  The paper's 2d-wide
feed-forward (which keeps the parameter count a Transformer's) is the model's ``d_ff``.

Causal only (the paper defines no bidirectional retention); any length; a padded position
neither writes nor decays the state.  Decoding keeps the state (B, H, Dk, 2d/H) and rotates at
absolute positions from ``ctx.cache.start``.
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


def retention_decays(n_heads: int) -> torch.Tensor:
    """log gamma_h = log(1 - 2^(-5-h)), h = 0 .. H-1 (section 2.2)."""
    return torch.log1p(-(2.0 ** (-5.0 - torch.arange(n_heads, dtype=torch.float64)))).float()


def rotate_pairs(x: torch.Tensor, start: int) -> torch.Tensor:
    """x (B, H, T, Dk) at positions start .. start + T - 1, each pair (2p, 2p + 1) rotated by
    the angle n theta_p, theta_p = 10000^(-p / (Dk/2 - 1)) (torchscale's linspace(0, 1))."""
    t, dk = x.shape[-2:]
    theta = 10000.0 ** -torch.linspace(0, 1, dk // 2, device=x.device)  # (Dk/2,)
    angle = torch.arange(start, start + t, device=x.device, dtype=torch.float32)[:, None] * theta
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)  # (T, Dk/2)
    even, odd = x.unflatten(-1, (-1, 2)).unbind(-1)  # (B, H, T, Dk/2) each
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


@ATTENTION.register("retnet")
class MultiScaleRetention(TokenMixer):
    provides = frozenset({"causal", "key_padding_mask", "variable_length"})
    sub_quadratic = True
    decode_state = "recurrent"

    param_width = "expand_v"
    """The option's own width, re-solved by ``match_params: {by: mixer}`` (any value whose
    expand_v x d_model is a whole multiple of the heads)."""

    def __init__(self, dims: ModelDims, head_dim: int | None = 256, n_heads: int | str | None = "model",
                 expand_v: float = 2, chunk_size: int = 64, eps: float = 1e-6):
        super().__init__()
        d = dims.d_model
        paper = max(1, d // head_dim) if head_dim else dims.n_heads  # of the paper's width, 256
        heads = (max(dims.n_heads, paper) if n_heads == "model" else
                 paper if n_heads is None else int(n_heads))
        if d % heads or (d // heads) % 2:
            raise ConfigError(f"attention=retnet: d_model={d} must split into {heads} heads of "
                              "an even width (set attention.n_heads)")
        width = round(expand_v * d)  # of W_V, W_G, W_O: 2d in the paper
        if expand_v <= 0 or abs(expand_v * d - width) > 1e-6 or width % heads:
            raise ConfigError(f"attention.expand_v={expand_v}: attention=retnet needs expand_v x "
                              f"d_model={d} to be a whole multiple of its {heads} heads")
        if chunk_size < 1:
            raise ConfigError(f"attention.chunk_size={chunk_size} must be positive")
        self.heads, self.chunk_size, self.scale = heads, chunk_size, (d // heads) ** -0.5
        self.q, self.k = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, width, bias=False)
        self.g = nn.Linear(d, width, bias=False)  # W_G
        self.norm = GroupNorm(width, heads, eps=eps, affine=False)
        self.out = nn.Linear(width, d, bias=False)  # W_O
        self.register_buffer("log_decay", retention_decays(heads).view(1, heads, 1, 1),
                             persistent=False)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        if not ctx.causal:
            raise ConfigError("attention=retnet is causal only (the paper defines no "
                              "bidirectional retention)")
        slot = ctx.cache.slot() if ctx.cache is not None else None  # decoding: this layer's
        start = ctx.cache.start if ctx.cache is not None else 0
        state = None if slot is None else slot.get("state")  # None at the first step

        def heads(y):  # (B, T, H * W) -> (B, H, T, W)
            return y.unflatten(-1, (self.heads, -1)).transpose(1, 2)

        q = rotate_pairs(heads(self.q(x)), start)
        k = rotate_pairs(heads(self.k(x)), start)
        o, state = gated_linear(q, k, heads(self.v(x)), self.log_decay, scale=self.scale,
                                chunk=self.chunk_size, state=state, keep_state=slot is not None,
                                key_padding_mask=ctx.key_padding_mask)  # (B, H, T, 2d/H)
        if slot is not None:
            slot["state"] = state
        y = self.norm(o.transpose(1, 2).flatten(2))  # (B, T, 2d)
        return self.out(F.silu(self.g(x)) * y)
