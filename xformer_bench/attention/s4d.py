"""S4D: Gu, Gupta, Goel & Ré 2022, "On the Parameterization and Initialization of Diagonal State
Space Models" (NeurIPS), as the authors' standalone layer (state-spaces/s4, ``models/s4/s4d.py``).

Each of the H = d_model channels is a diagonal complex state space of N/2 modes (N = ``d_state``,
the modes standing for N/2 conjugate pairs, so the output is real), discretised by zero-order
hold with a learnt step dt_h:

    x_t = Abar x_{t-1} + u_t,   Abar = exp(dt A),
    y_t = 2 Re(C' x_t) + D u_t, C' = C (exp(dt A) - 1) / A   (ZOH's Bbar, B = 1, folded into C),

which unrolls to the convolution y = K * u + D u with the kernel (section 3, Vandermonde)

    K_l = 2 Re(sum_n C'_n Abar_n^l),  l = 0 .. T - 1.

Then GELU and the position-wise output of the standalone layer, a linear map to 2H channels and
a GLU (``out``).  Initialisation (S4D-Lin, section 4): A_n = -1/2 + i pi n, stored as
log(-Re A) and Im A; C standard complex normal (real and imaginary parts N(0, 1/2)); D ~ N(0, 1);
log dt ~ U[log dt_min, log dt_max] with [0.001, 0.1].  A, C, D and dt are all learnt.

Computation.  Training builds K (length T) and applies it by FFT convolution
(:mod:`~xformer_bench.attention._ops.long_conv`): causally with the exactly-causal tiled form,
bidirectionally as S4's two-kernel form -- a second C (the same A and dt) gives an anticausal
kernel K', y_t += sum_{s > t} K'_{s-t-1} u_s, the two kernels summed into one FFT.  The
Vandermonde product is taken ``chunk_size`` positions at a time, Abar^(i c + j) = Abar^(i c)
Abar^j, so its largest tensor is (H, T) rather than the authors' (H, N/2, T).  Decoding runs
the recurrence above from ``ctx.cache``'s state, (B, H, N/2) complex: O(N) per channel and
token; a multi-token step convolves its tokens and adds the state's response 2 Re(C' Abar^(l+1)
x_0).  On a GPU the same code runs on cuFFT; fla has no S4D kernel.

Deviations.  The authors give the SSM parameters their own learning rate (min(lr, 0.001)) and no
weight decay; here they take the model's learning rate, and are stored as flat 1-D tensors so
the optimiser's no-decay group (every tensor under 2-D) holds them -- weight decay 0 as theirs.
Their standalone layer is causal only; the anticausal C is S4's ``bidirectional`` option.  It
is drawn at construction (so a causal and a bidirectional layer start from the same draws) and
dropped by :meth:`S4D.specialise` when the model reads the layer causally, so a causal model
holds no parameter it never trains (N/2 x H complex numbers per layer).  Dropout (tied
across positions, their ``DropoutNd``) follows the GELU as theirs.  A key padding mask zeroes
the padded inputs, so they reach no other position.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import TokenMixer
from xformer_bench.attention._ops.feature_maps import full_precision
from xformer_bench.attention._ops.long_conv import causal_conv, two_sided_conv
from xformer_bench.attention._ops.token_mlp import drop_padding
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.errors import ConfigError
from xformer_bench.registry import ATTENTION


def ssm_kernel(dta: torch.Tensor, coeff: torch.Tensor, length: int, chunk: int) -> torch.Tensor:
    """K_l = 2 Re(sum_n coeff_n exp(dta_n l)), l < ``length``: dta (H, M), coeff (..., H, M)
    complex -> (..., H, length) real, ``chunk`` positions per Vandermonde block."""
    c = max(1, min(chunk, length))
    blocks = -(-length // c)
    steps = torch.arange(max(c, blocks), device=dta.device, dtype=dta.real.dtype)
    within = torch.exp(dta[..., None] * steps[:c])  # (H, M, c): Abar^j
    starts = torch.exp(dta[..., None] * (steps[:blocks] * c))  # (H, M, n): Abar^(i c)
    weights = (coeff[..., None] * starts).transpose(-1, -2)  # (..., H, n, M)
    # Re(W V) = [Re W, -Im W] @ [Re V; Im V]: one real matmul (complex bmm is slow on CPUs)
    real = (torch.cat([weights.real, -weights.imag], dim=-1)
            @ torch.cat([within.real, within.imag], dim=-2))  # (..., H, n, c)
    return 2 * real.flatten(-2)[..., :length]  # (..., H, length)


@ATTENTION.register("s4d")
class S4D(TokenMixer):
    provides = frozenset({"causal", "bidirectional", "key_padding_mask", "variable_length"})
    sub_quadratic = True  # O(T log^2 T) convolution, O(H N T) kernel, no T x T
    decode_state = "recurrent"

    def __init__(self, dims: ModelDims, d_state: int = 64, dt_min: float = 0.001,
                 dt_max: float = 0.1, dropout: float = 0.0, chunk_size: int = 64):
        super().__init__()
        if d_state < 2 or d_state % 2:
            raise ConfigError(f"attention.d_state={d_state} must be an even integer >= 2 "
                              "(N/2 conjugate pairs of modes)")
        if not 0 < dt_min <= dt_max:
            raise ConfigError(f"attention.dt_min={dt_min}, dt_max={dt_max}: need 0 < dt_min "
                              "<= dt_max")
        if not 0 <= dropout < 1:
            raise ConfigError(f"attention.dropout={dropout} must lie in [0, 1)")
        if chunk_size < 1:
            raise ConfigError(f"attention.chunk_size={chunk_size} must be positive")
        h, m = dims.d_model, d_state // 2
        self.channels, self.n_modes, self.dropout, self.chunk_size = h, m, dropout, chunk_size
        lo, hi = math.log(dt_min), math.log(dt_max)
        self.log_dt = nn.Parameter(torch.rand(h) * (hi - lo) + lo)  # (H,)
        # S4D-Lin: A_n = -1/2 + i pi n; flat (H M,) so that no weight decay applies (see above)
        self.log_a_real = nn.Parameter(torch.full((h * m,), math.log(0.5)))
        self.a_imag = nn.Parameter((math.pi * torch.arange(m, dtype=torch.float32)).repeat(h))
        c = torch.randn(2, h, m, dtype=torch.cfloat)  # (direction, H, M): causal, anticausal
        self.directions = 2  # until specialise(causal=True) keeps the causal C alone
        self.c = nn.Parameter(torch.view_as_real(c).flatten())  # (directions H M 2,)
        self.d = nn.Parameter(torch.randn(h))  # (H,)
        self.out = nn.Linear(h, 2 * h)  # position-wise, then a GLU (the standalone layer's)

    def specialise(self, causal: bool) -> None:
        """Told by the assembly that builds it, before the model's initialisation and
        optimiser, whether its model reads this layer causally: a causal one drops the
        anticausal C (the layer then refuses bidirectional use); a bidirectional one keeps
        both, as does a layer built on its own (tests, benchmarks)."""
        if causal and self.directions == 2:
            kept = self.c.detach()[: self.c.numel() // 2].clone()
            self.c, self.directions = nn.Parameter(kept), 1
            self.provides = self.provides - {"bidirectional"}

    def discretised(self, directions: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
        """dt A (H, M) and C' = C (exp(dt A) - 1) / A (directions, H, M), complex64."""
        if directions > self.directions:
            raise ValueError("this S4D layer was built for a causal model (specialise): it has "
                             "no anticausal C for bidirectional use")
        h, m = self.channels, self.n_modes
        a = torch.complex(-self.log_a_real.float().exp(), self.a_imag.float()).view(h, m)
        dta = a * self.log_dt.float().exp()[:, None]  # (H, M)
        c = torch.view_as_complex(self.c.float().view(self.directions, h, m, 2))[:directions]
        return dta, c * (torch.exp(dta) - 1) / a  # (H, M), (dirs, H, M)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # x: (B, T, D)
        u = drop_padding(x, ctx.key_padding_mask).transpose(1, 2)  # (B, H, T)
        if ctx.cache is not None:
            y = self._decode(u, ctx)
        else:
            t = u.shape[-1]
            with full_precision(u):
                dta, coeff = self.discretised(1 if ctx.causal else 2)
                k = ssm_kernel(dta, coeff, t, self.chunk_size)  # (dirs, H, T)
            y = (causal_conv(u, k[0], chunk=self.chunk_size) if ctx.causal
                 else two_sided_conv(u, k[0], k[1]))  # (B, H, T)
        y = F.gelu(y + u * self.d[:, None].to(u.dtype))
        if self.training and self.dropout:  # tied across positions (their DropoutNd)
            y = y * F.dropout(y.new_ones(*y.shape[:2], 1), self.dropout)
        return F.glu(self.out(y.transpose(1, 2)), dim=-1)  # (B, T, D)

    def _decode(self, u: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """The new tokens u (B, H, n) from the cached state x_0 (B, H, M), None at the first
        step: y_l = (K * u)_l + 2 Re(C' Abar^(l+1) x_0); the state after them is
        Abar^n x_0 + sum_j Abar^(n-1-j) u_j."""
        slot = ctx.cache.slot()
        state, n = slot.get("state"), u.shape[-1]
        with full_precision(u):
            dta, coeff = self.discretised()
            coeff, signal = coeff[0], u.float()
            k = ssm_kernel(dta, coeff, n, self.chunk_size)  # (H, n)
            y = causal_conv(signal, k, chunk=self.chunk_size)  # (B, H, n)
            powers = torch.exp(dta[..., None] * torch.arange(n + 1, device=u.device))  # (H, M, n+1)
            after = torch.einsum("bhl,hml->bhm", signal.to(powers.dtype), powers[..., :n].flip(-1))
            if state is not None:
                y = y + 2 * torch.einsum("bhm,hml->bhl", state * coeff, powers[..., 1:]).real
                after = after + state * powers[..., n]
        slot["state"] = after  # (B, H, M) complex64
        return y.to(u.dtype)
