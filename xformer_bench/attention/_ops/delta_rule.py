"""The delta rule, shared by ``deltanet`` and ``gated_deltanet``: a (Dk, Dv) fast-weight state
written one key-value pair at a time (Schlag, Irie & Schmidhuber 2021), optionally decayed by a
scalar per head and position (Yang, Kautz & Hatamizadeh 2025):

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = scale S_t^T q_t,

S (Dk, Dv) as fla keeps it (the papers' S^T), alpha_t = exp(log_alpha_t) in (0, 1] (1 without
decay), beta_t in [0, 1], k_t L2-normalised by the caller.

**Chunked form** (Yang, Wang, Zhang, Shen & Kim 2024, "Parallelizing Linear Transformers with
the Delta Rule over Sequence Length", section 3, with the gated extension of Yang et al. 2025,
section 3.3).  With the pseudo-values u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t) the update is
additive, S_t = alpha_t S_{t-1} + k_t u_t^T.  In a chunk of C positions starting from state S0,
with g_i = sum_{j<=i} log alpha_j (within the chunk) and gamma_i = exp(g_i),

    (I + A) U = diag(beta) V - diag(beta gamma) K S0,  A_ij = beta_i exp(g_i - g_j) k_i.k_j, j < i,

so U = U0 - W S0 with U0 = (I + A)^-1 diag(beta) V and W = (I + A)^-1 diag(beta gamma) K (the
WY / UT-transform representation: one unit-lower-triangular inverse per chunk, every chunk at
once, :func:`unit_lower_inverse`), then

    O   = scale [diag(gamma) Q S0 + (Q K^T * exp(g_i - g_j) [j <= i]) U],
    S_C = gamma_C S0 + (K * exp(g_C - g_j))^T U,

recurrent across chunks.  Every exponent is a difference g_i - g_j with j <= i, so <= 0: the
decays never overflow however long the chunk (the "log space" of the 2025 paper).  Each
difference is summed as such, sum_{j<l<=i} log alpha_l (Mamba-2's segment sum), not subtracted
from two running sums, whose rounding grows with their size (after a near-total reset of
log alpha = -400, float32 keeps g to 1e-4 and every later gap with it).  O(T C) for
the within-chunk matrices, O(T / C) states kept for backward, never a T x T tensor.  A final
partial chunk is padded with beta = 0, k = 0, log_alpha = 0 positions, which leave the state as
it is.  Computed in float32 with autocast off (a bf16 state would round away what the early
positions wrote); the output comes back in ``v``'s dtype, the state in float32.

:func:`delta_rule_step` is the recurrence itself for one position (incremental decoding).  On a
CUDA tensor with flash-linear-attention installed (``pip install -e ".[fla]"``),
:func:`delta_rule` calls fla's chunked Triton kernels for the same computation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from xformer_bench.attention._ops.fla_kernels import fla_available, use_fla  # noqa: F401

BACKENDS = ("auto", "torch", "fla")


def delta_rule(
    q: torch.Tensor,  # (B, H, T, Dk)
    k: torch.Tensor,  # (B, H, T, Dk), L2-normalised
    v: torch.Tensor,  # (B, H, T, Dv)
    beta: torch.Tensor,  # (B, H, T), in [0, 1]
    log_alpha: torch.Tensor | None = None,  # (B, H, T), <= 0; None: no decay
    *,
    scale: float,
    chunk_size: int = 64,
    initial_state: torch.Tensor | None = None,  # (B, H, Dk, Dv); None: zeros
    backend: str = "auto",  # auto: fla's kernels on CUDA when installed, else PyTorch
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, H, T, Dv) in v's dtype, (B, H, Dk, Dv) float32
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "fla" or (backend == "auto" and use_fla(q, gated=log_alpha is not None)):
        return _fla(q, k, v, beta, log_alpha, scale, initial_state)
    with torch.autocast(v.device.type, enabled=False):
        args = [None if x is None else x.float() for x in (q, k, v, beta, log_alpha,
                                                            initial_state)]
        if q.shape[-2] == 1:  # one position: the recurrence itself
            out, state = delta_rule_step(*[a if a is None else a.squeeze(2) for a in args[:5]],
                                         scale=scale, state=args[5])
            return out.unsqueeze(2).to(v.dtype), state
        out, state = _chunked(*args, scale=scale, chunk=chunk_size)
    return out.to(v.dtype), state


def delta_rule_step(
    q: torch.Tensor,  # (B, H, Dk)
    k: torch.Tensor,  # (B, H, Dk)
    v: torch.Tensor,  # (B, H, Dv)
    beta: torch.Tensor,  # (B, H)
    log_alpha: torch.Tensor | None = None,  # (B, H)
    *,
    scale: float,
    state: torch.Tensor | None = None,  # (B, H, Dk, Dv)
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, H, Dv), (B, H, Dk, Dv)
    """One position of the recurrence: S = alpha S; S += beta k (v - S^T k)^T; o = scale S^T q."""
    if state is None:
        state = q.new_zeros(*q.shape, v.shape[-1])
    if log_alpha is not None:
        state = state * log_alpha.exp()[..., None, None]
    error = v - (k.unsqueeze(-2) @ state).squeeze(-2)  # (B, H, Dv): v - S^T k
    state = state + (beta[..., None] * k).unsqueeze(-1) * error.unsqueeze(-2)
    return scale * (q.unsqueeze(-2) @ state).squeeze(-2), state


def _chunked(q, k, v, beta, log_alpha, initial_state, *, scale, chunk):
    b, h, t, dk = k.shape
    dv = v.shape[-1]
    chunk = max(1, min(chunk, t))
    n = -(-t // chunk)
    pad = n * chunk - t  # the last chunk's missing positions: beta = 0 leaves the state alone

    def blocks(x):  # (B, H, T, ...) -> (B, H, N, C, ...)
        x = F.pad(x, (0, 0, 0, pad) if x.dim() == 4 else (0, pad))
        return x.unflatten(2, (n, chunk))

    q, k, v, beta = blocks(q), blocks(k), blocks(v), blocks(beta)
    inclusive = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril()  # j <= i
    strict = inclusive.tril(-1)  # j < i
    if log_alpha is None:
        decay = inclusive.to(q.dtype)  # (C, C)
        gamma = end = None
    else:
        log_alpha = blocks(log_alpha)  # (B, H, N, C)
        # g_i - g_j as the sum of log alpha over j < l <= i itself, not as a difference of two
        # running sums: those grow with the chunk and lose the small gaps to rounding
        gap = log_alpha[..., :, None].expand(*log_alpha.shape, chunk).masked_fill(~strict, 0.0)
        gap = gap.cumsum(-2).masked_fill(~inclusive, float("-inf"))  # (B, H, N, C, C)
        decay = gap.exp()  # gamma_i / gamma_j where j <= i, else 0
        gamma = log_alpha.cumsum(-1).exp()[..., None]  # (B, H, N, C, 1): gamma_i
        end = gamma[..., -1:, :]  # (B, H, N, 1, 1): gamma_C
        to_end = decay[..., -1, :, None]  # (B, H, N, C, 1): gamma_C / gamma_j
    keys = k * beta[..., None]
    a = (keys @ k.transpose(-1, -2) * decay).masked_fill(~strict, 0.0)  # (B, H, N, C, C)
    inverse = unit_lower_inverse(a)  # (B, H, N, C, C): the UT transform (I + A)^-1
    u0 = inverse @ (v * beta[..., None])  # (B, H, N, C, Dv)
    w = inverse @ (keys if gamma is None else keys * gamma)  # (B, H, N, C, Dk)
    scores = scale * (q @ k.transpose(-1, -2)) * decay  # (B, H, N, C, C), 0 where j > i
    q = scale * (q if gamma is None else q * gamma)  # reads S0
    k = k if gamma is None else k * to_end  # writes S_C
    state = q.new_zeros(b, h, dk, dv) if initial_state is None else initial_state
    outputs = []
    for i, (qi, ki, u0i, wi, si) in enumerate(zip(q.unbind(2), k.unbind(2), u0.unbind(2),
                                                  w.unbind(2), scores.unbind(2))):
        u = u0i - wi @ state  # (B, H, C, Dv): the pseudo-values
        outputs.append(qi @ state + si @ u)
        state = (state if end is None else state * end[:, :, i]) + ki.transpose(-1, -2) @ u
    return torch.stack(outputs, dim=2).flatten(2, 3)[:, :, :t], state


def unit_lower_inverse(a: torch.Tensor) -> torch.Tensor:
    """(I + A)^-1 for strictly lower-triangular A (..., C, C), by recursive doubling of the
    diagonal blocks: [[X1, 0], [M21, M22]]^-1 = [[X1^-1, 0], [-X2^-1 M21 X1^-1, X2^-1]],
    every block of a level in one batched matmul (LAPACK's trtri, batched).  Row i reads rows
    <= i of A only (the rest enters as exact zeros).  Not ``torch.linalg.solve_triangular``:
    its batched CPU form runs one threaded call per matrix, seconds per layer on a busy
    2-core machine against milliseconds for the matmuls."""
    c = a.shape[-1]
    p = 1 << max(c - 1, 0).bit_length()  # C rounded up to a power of two; padding stays I
    a = F.pad(a, (0, p - c, 0, p - c))
    inverse = a.new_ones(*a.shape[:-2], p, 1, 1)  # (..., p / s, s, s): the blocks' inverses
    s = 1
    while s < p:
        n = p // (2 * s)
        pairs = inverse.unflatten(-3, (n, 2))  # (..., n, 2, s, s)
        x1, x2 = pairs[..., 0, :, :], pairs[..., 1, :, :]
        grid = a.unflatten(-1, (n, 2, s)).unflatten(-4, (n, 2, s))  # (..., n, 2, s, n, 2, s)
        diagonal = grid.diagonal(dim1=-6, dim2=-3)  # (..., 2, s, 2, s, n): the pairs' blocks
        lower = diagonal[..., 1, :, 0, :, :].movedim(-1, -3)  # (..., n, s, s): their M21
        corner = -(x2 @ lower @ x1)
        inverse = torch.cat([torch.cat([x1, torch.zeros_like(x1)], -1),
                             torch.cat([corner, x2], -1)], -2)  # (..., n, 2s, 2s)
        s *= 2
    return inverse.squeeze(-3)[..., :c, :c]


def _fla(q, k, v, beta, log_alpha, scale, initial_state):
    """fla's chunked kernels over (B, T, H, D) inputs (fla >= 0.3: the same keywords since)."""
    dtype = v.dtype
    q, k, v = (x.to(dtype).transpose(1, 2).contiguous() for x in (q, k, v))
    beta = beta.to(dtype).transpose(1, 2).contiguous()
    state = None if initial_state is None else initial_state.float().contiguous()
    kwargs = dict(scale=scale, initial_state=state, output_final_state=True)
    if log_alpha is None:
        from fla.ops.delta_rule import chunk_delta_rule

        out, final = chunk_delta_rule(q, k, v, beta, **kwargs)
    else:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        g = log_alpha.float().transpose(1, 2).contiguous()
        out, final = chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
    return out.transpose(1, 2), final.float()
