"""Nyströmformer (Xiong, Zeng, Chakraborty, Tan, Fung, Li & Singh 2021, "Nyströmformer: A
Nyström-Based Algorithm for Approximating Self-Attention", AAAI): softmax attention through
m landmarks,

    S_hat V = softmax(Q K~^T / sqrt(Dh)) Z* softmax(Q~ K^T / sqrt(Dh)) V,          (eq. 14)
    Z* ~ A_S^+,  A_S = softmax(Q~ K~^T / sqrt(Dh)),

with Q~ and K~ the segment means of the queries and of the keys: the sequence is cut into m
consecutive segments and each landmark is the mean of one (section 3, "Selection of
landmarks").  The Moore-Penrose pseudo-inverse A_S^+ is approximated iteratively (eq. 16,
after Razavi et al. 2014),

    Z_{j+1} = 1/4 Z_j (13 I - A_S Z_j (15 I - A_S Z_j (7 I - A_S Z_j))),
    Z_0 = A_S^T / (||A_S||_1 ||A_S||_inf),

for 6 iterations (the paper's setting), Z_0 per matrix as in the paper's formula (the
authors' code scales by a maximum over the whole batch, which would couple batch rows).  The
output adds a depth-wise convolution of the values along the sequence, one kernel per head
shared by its Dh channels, zero-padded to the same length -- the skip connection of the
authors' code (``conv_kernel_size`` 33 in their BERT configuration, ``nystrom-512/config.json``
of mlpen/Nystromformer; 35 in their LRA configuration); ``conv_kernel: 0`` leaves it out.
Default m = 64 (the paper's Nyströmformer-64).  Cost O(T m Dh + m^3) per head: no T x T tensor.

Lengths that are no multiple of m: position i of T belongs to segment floor(i m / T), so the
segments are consecutive, of floor(T/m) or ceil(T/m) positions, and never empty -- the paper's
equal segments when m divides T.  (Padding the sequence with zeros instead would pull the
last landmarks towards the origin, or leave whole segments empty.)  Fewer than m positions:
every position is its own landmark (m = T).  More keys than queries: the keys' landmarks are
m segments of the S keys.

Bidirectional only (a landmark mixes every position of its segment, and every query reaches
every landmark).  Key padding follows the authors' code: padded queries and keys are zeroed
before the landmark means, padded keys get no weight in softmax(Q~ K^T), padded values are
zeroed before the convolution -- padding has no influence, and a fully padded row gives 0.
Not declared: ``additive_bias`` (a landmark has no position).
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.errors import ConfigError
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION


def segment_means(x: torch.Tensor, m: int) -> torch.Tensor:  # (B, H, N, D) -> (B, H, m, D)
    """Means of m consecutive segments of the N rows; row i belongs to segment floor(i m / N)."""
    n = x.shape[-2]
    if n % m == 0:  # the paper's equal segments, a reshape
        return x.unflatten(-2, (m, n // m)).mean(-2)
    segment = torch.arange(n, device=x.device) * m // n  # (N,): sizes floor or ceil of N / m
    sums = x.new_zeros(*x.shape[:-2], m, x.shape[-1]).index_add(-2, segment, x)  # (B, H, m, D)
    # segment k holds rows [ceil(k N / m), ceil((k + 1) N / m)): its size from the shapes alone
    # (a bincount's length is its largest value, read back from the device)
    starts = (torch.arange(m + 1, device=x.device) * n + m - 1) // m  # (m + 1,)
    return sums / (starts[1:] - starts[:-1]).to(x.dtype)[:, None]


def iterative_pinv(a: torch.Tensor, iterations: int) -> torch.Tensor:  # (..., m, m), a >= 0
    """Razavi et al.'s iteration for the Moore-Penrose pseudo-inverse, as eq. 16."""
    eye = torch.eye(a.shape[-1], device=a.device, dtype=a.dtype)
    norm_1 = a.sum(-2).amax(-1)[..., None, None]  # (..., 1, 1): largest column sum
    norm_inf = a.sum(-1).amax(-1)[..., None, None]  # (..., 1, 1): largest row sum
    z = a.transpose(-1, -2) / (norm_1 * norm_inf).clamp(min=torch.finfo(a.dtype).tiny)
    for _ in range(iterations):
        az = a @ z  # (..., m, m)
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


@ATTENTION.register("nystromformer")
class NystromAttention(AttentionKernel):
    provides = frozenset({"bidirectional", "longer_keys", "key_padding_mask", "variable_length"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, n_landmarks: int = 64, pinv_iterations: int = 6,
                 conv_kernel: int = 33):
        super().__init__()
        if n_landmarks < 1 or pinv_iterations < 0 or conv_kernel < 0:
            raise ConfigError(f"attention=nystromformer: n_landmarks={n_landmarks} must be "
                              f"positive, pinv_iterations={pinv_iterations} and "
                              f"conv_kernel={conv_kernel} not negative")
        if conv_kernel and conv_kernel % 2 == 0:
            raise ConfigError(f"attention=nystromformer: conv_kernel={conv_kernel} must be odd "
                              "(a same-length convolution), or 0 for none")
        self.n_landmarks, self.pinv_iterations = n_landmarks, pinv_iterations
        self.conv = None
        if conv_kernel:  # the authors' nn.Conv2d(H, H, (kernel, 1), groups=H), PyTorch's init
            self.conv = nn.Conv2d(dims.n_heads, dims.n_heads, (conv_kernel, 1),
                                  padding=(conv_kernel // 2, 0), groups=dims.n_heads, bias=False)

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
            raise ValueError("attention=nystromformer is bidirectional and takes no additive bias")
        t, s, dh = q.shape[-2], k.shape[-2], q.shape[-1]
        m = min(self.n_landmarks, t)
        key_valid = None
        if key_padding_mask is not None:
            key_valid = ~key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
            padded = key_padding_mask[:, None, :, None]  # (B, 1, S, 1)
            q = q.masked_fill(padded[:, :, s - t:], 0.0)
            k, v = k.masked_fill(padded, 0.0), v.masked_fill(padded, 0.0)
        scale = dh ** -0.5
        q_landmarks, k_landmarks = segment_means(q, m), segment_means(k, m)  # (B, H, m, Dh) each
        kernel_1 = ((q @ k_landmarks.transpose(-1, -2)) * scale).float().softmax(-1)  # (B, H, T, m)
        kernel_2 = ((q_landmarks @ k_landmarks.transpose(-1, -2)) * scale).float().softmax(-1)
        scores_3 = (q_landmarks @ k.transpose(-1, -2)).float() * scale  # (B, H, m, S)
        if key_valid is not None:
            scores_3 = scores_3.masked_fill(~key_valid, torch.finfo(torch.float32).min)
        kernel_3 = scores_3.softmax(-1)  # (B, H, m, S)
        if key_valid is not None:
            kernel_3 = kernel_3 * key_valid  # a fully padded row: no weight at all
        landmark_values = iterative_pinv(kernel_2, self.pinv_iterations) @ (
            kernel_3.to(v.dtype) @ v).float()  # (B, H, m, Dh)
        out = (kernel_1 @ landmark_values).to(v.dtype)  # (B, H, T, Dh)
        if self.conv is not None:
            out = out + self.conv(v)[:, :, s - t:]  # (B, H, T, Dh): depth-wise along positions
        return out
