"""Gated DeltaNet: Yang, Kautz & Hatamizadeh 2025, "Gated Delta Networks: Improving Mamba2 with
Delta Rule" (ICLR).  DeltaNet's layer (:mod:`xformer_bench.attention.deltanet`: L2-normalised
SiLU q/k after a short convolution, beta_t = sigmoid(W_beta x_t)) with the delta rule gated by a
data-dependent scalar decay per head (section 3, eq. 10):

    S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,    o_t = S_t q_t / sqrt(Dk),
    alpha_t = exp(-exp(A_log) softplus(W_a x_t + dt_bias))     (Mamba-2's parameterisation),
    y_t = W_O [RMSNorm(o_t) * SiLU(W_g x_t)]_heads            (the output gate, section 3.4).

At the authors' defaults (their ``GatedDeltaNet`` layer, NVlabs/GatedDeltaNet): key width 0.75 d
and value width 1.5 d over the heads, short convolutions of width 4 without bias, W_beta with a
bias, W_a without (dt_bias takes its place), A ~ U(0, 16) per head (A_log = log A), dt_bias the
inverse softplus of dt ~ log-uniform [1e-3, 1e-1] floored at 1e-4 (hard-coded there, as in
Mamba-2); RMSNorm eps 1e-6 (fla's ``GatedDeltaNetConfig``).  The chunked engine folds the
cumulative decays in log space (:mod:`xformer_bench.attention._ops.delta_rule`); on CUDA with
fla installed, fla's ``chunk_gated_delta_rule``.

A padded position gets beta = 0 and alpha = 1 (it neither writes nor decays the state) and zero
convolution inputs.  Causal only, any length, O(1) decoding state per layer (S and the
convolution's last inputs).  Deviations: H follows ``model.n_heads`` (the paper: head dim 256);
A_log and dt_bias are excluded from weight decay by being 1-D, as every 1-D parameter here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention.deltanet import DeltaNet
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import ATTENTION

A_INIT = (0.0, 16.0)
"""A ~ U(A_INIT) per head (the authors' code; Mamba-2 draws from (1, 16))."""
DT_INIT = (1e-3, 1e-1, 1e-4)
"""dt ~ log-uniform [min, max], floored: dt_bias = softplus^-1(dt) (the authors' code, Mamba-2)."""


@ATTENTION.register("gated_deltanet")
class GatedDeltaNet(DeltaNet):
    option = "gated_deltanet"
    beta_bias = True  # the authors' b_proj has a bias

    def __init__(self, dims: ModelDims, expand_k: float = 0.75, expand_v: float = 1.5,
                 conv_size: int = 4, use_gate: bool = True, norm_eps: float = 1e-6,
                 chunk_size: int = 64):
        super().__init__(dims, expand_k=expand_k, expand_v=expand_v, conv_size=conv_size,
                         use_gate=use_gate, norm_eps=norm_eps, chunk_size=chunk_size)
        self.decay = nn.Linear(dims.d_model, self.heads, bias=False)  # W_a
        self.A_log = nn.Parameter(torch.empty(self.heads).uniform_(*A_INIT).log())
        low, high, floor = DT_INIT
        dt = torch.exp(torch.rand(self.heads) * (math.log(high) - math.log(low)) + math.log(low))
        dt = dt.clamp(min=floor)
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1(dt)

    def log_decay(self, x: torch.Tensor) -> torch.Tensor:
        """log alpha_t = -exp(A_log) softplus(W_a x_t + dt_bias): (B, T, H), <= 0, float32."""
        return -self.A_log.float().exp() * F.softplus(self.decay(x).float() + self.dt_bias)
