"""Sparse Sinkhorn attention: Tay, Bahri, Yang, Metzler & Juan 2020, "Sparse Sinkhorn
Attention" (ICML), §3, with details of the authors' code (long-range-arena
``sinkhorn_attention.py``).

The sequence is cut into N blocks of ``block`` positions.  A meta sorting network scores, for
each query block i, every key block j from a pooled block representation: per head,
``R_i = W2 relu(W1 pool_i + b1) + b2`` over the keys, its outputs cut to the N blocks present
(the authors' code has one output per possible block, ``max_num_blocks``; here N_max =
ceil(seq_len / block), so inputs longer than ``data.seq_len`` are refused).  Sinkhorn
normalisation in log space (Mena et al. 2018's Gumbel-Sinkhorn: ``(R + Gumbel noise) / tau``,
noise in training only) turns R into a soft permutation P; the sorted key block i is
``sum_j P_ij K_j`` (values alike), and each query block attends to its sorted block plus its
own local block (§3.2): 2 x block keys per query, so memory is O(T block + N^2).

Simplifications, named: a last row normalisation follows the paper's S^k = F_c(F_r(S^(k-1)))
iterations, so every sorted block is an exact convex combination of key blocks (the two agree
at convergence).  Padding: a sorted slot is the P-mixture of the blocks' keys at that slot
with padded keys as zero vectors, and its logit gets + log(mass of valid keys in the
mixture), so all-padding slots are masked; pooling averages valid keys only.

**Causal** (§3.3, Causal Sinkhorn Balancing), and what guarantees it:

1. pooling sees no future: block i is represented by the mean of the keys at positions up to
   and including its *first* position (the authors' code takes the block's first cumulative
   key; here the cumulative *mean*, whose scale does not grow along the sequence), summed
   over the earlier blocks exclusively, so not even rounding carries a later key into it;
2. block i may only be sorted onto strictly earlier blocks j < i (the lower-triangular mask),
   so every key it borrows precedes every query of block i; block 0 has only its local block;
3. the balancing is causal: rows are normalised over j < i, and columns over the rows *up to
   i* (a running cumulative sum).  A plain column sum -- even masked, as in the authors'
   code -- would let block i's weights depend on later blocks' scores.  By induction, row i of
   every iterate depends on rows <= i of R only, i.e. on keys at positions <= start of block i;
4. the local block is masked causally.
So the output at position t depends on inputs at positions <= t only.  (With j < i, the only
matrix whose rows 1.. and columns ..N-2 all sum to 1 is the shift "each block takes the
previous one": causal balancing pulls P towards it, the more so the more iterations.)

Defaults: block 64, 8 Sinkhorn iterations, temperature 0.75 -- the issue's reading of the
paper's settings; lucidrains' reproduction cites 0.75 as the paper's best temperature.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from xformer_bench.attention import AttentionKernel
from xformer_bench.attention._ops.sparse import softmax_attention
from xformer_bench.core.dims import ModelDims
from xformer_bench.position import PairBias
from xformer_bench.registry import ATTENTION

MASKED = -1e9  # a log-weight that is zero after exp, finite so that no row gives NaN
UNDERFLOW = -80.0
"""exp is taken of log-weights clamped here: exp of inputs under -87 (float32 underflow)
takes a slow path on CPU (~6x); above 1e-35 nothing changes."""


def sinkhorn(log_alpha: torch.Tensor, allowed: torch.Tensor, iters: int,
             causal: bool) -> torch.Tensor:
    """The balanced matrix P (..., N, N) of scores ``log_alpha`` over the ``allowed`` (N, N)
    pairs, in log space: a row normalisation, then ``iters`` times columns and rows (columns
    over the rows up to each row when ``causal``), so it ends on rows; disallowed pairs (and
    empty rows) get 0."""
    def rows(log_p: torch.Tensor) -> torch.Tensor:
        return log_p.masked_fill(~allowed, MASKED).log_softmax(dim=-1).masked_fill(~allowed, MASKED)

    log_p = rows(log_alpha.float())  # every allowed log-weight is <= 0 from here on
    for _ in range(iters):
        if causal:  # normalise by the column's sum over this row and the rows before
            prefix = log_p.clamp(min=UNDERFLOW).exp().cumsum(dim=-2)  # (..., N, N), >= exp(log_p)
            log_p = rows(log_p - prefix.log())
        else:
            log_p = rows(log_p.log_softmax(dim=-2))
    return log_p.clamp(min=UNDERFLOW).exp() * allowed


def blocks_before(x: torch.Tensor) -> torch.Tensor:
    """The exclusive prefix sum over blocks, (B, H, N, D) -> (B, H, N, D): block i gets the sum
    of blocks 0 .. i - 1 only (not ``cumsum - x``, which rounds through block i's own keys)."""
    return F.pad(x.cumsum(dim=2)[:, :, :-1], (0, 0, 1, 0))


@ATTENTION.register("sinkhorn")
class SinkhornAttention(AttentionKernel):
    provides = frozenset({"causal", "bidirectional", "key_padding_mask"})
    sub_quadratic = True

    def __init__(self, dims: ModelDims, block: int = 64, sinkhorn_iters: int = 8,
                 temperature: float = 0.75):
        super().__init__()
        if block < 1 or sinkhorn_iters < 0 or temperature <= 0:
            raise ValueError("attention.block must be positive, sinkhorn_iters >= 0, "
                             "temperature > 0")
        self.block, self.iters, self.temperature = block, sinkhorn_iters, temperature
        self.max_blocks = math.ceil(dims.seq_len / block)
        h, dh, n = dims.n_heads, dims.head_dim, self.max_blocks
        # the meta sorting network, one per head: pooled keys (Dh) -> hidden (Dh) -> N_max
        self.sort_hidden = nn.Parameter(torch.randn(h, dh, dh) * dh ** -0.5)  # (H, Dh, Dh)
        self.sort_hidden_bias = nn.Parameter(torch.zeros(h, 1, dh))  # (H, 1, Dh)
        self.sort_scores = nn.Parameter(torch.randn(h, dh, n) * dh ** -0.5)  # (H, Dh, N_max)
        self.sort_scores_bias = nn.Parameter(torch.zeros(h, 1, n))  # (H, 1, N_max)

    def sort_logits(self, pooled: torch.Tensor) -> torch.Tensor:
        """R (B, H, N, N): row i scores the key blocks for query block i from ``pooled``
        (B, H, N, Dh), the block representations."""
        hidden = torch.relu(pooled @ self.sort_hidden + self.sort_hidden_bias)  # (B, H, N, Dh)
        return (hidden @ self.sort_scores + self.sort_scores_bias)[..., : pooled.shape[2]]

    def pool(self, k_blocks: torch.Tensor, valid: torch.Tensor, causal: bool) -> torch.Tensor:
        """Block representations (B, H, N, Dh) from keys (B, H, N, b, Dh) (zero where not
        ``valid``, (B, 1, N, b, 1)): the block's mean, or, causal, the mean of every key up to
        the block's first position."""
        total = k_blocks.sum(dim=3)  # (B, H, N, Dh)
        count = valid.sum(dim=3)  # (B, 1, N, 1)
        if causal:  # the blocks before (an exclusive sum: no rounding through later keys),
            total = blocks_before(total) + k_blocks[:, :, :, 0]  # plus the block's first key
            count = blocks_before(count) + valid[:, :, :, 0]
        return total / count.clamp(min=1)

    def borrow(self, p: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor,
               valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The sorted blocks, ``sum_j P_ij K_j`` and ``sum_j P_ij V_j`` (B, H, N, b, Dh) each, and
        the mass of valid keys in each of their slots (B, H, N, b), from P (B, H, N, N)."""
        both = torch.cat((k_blocks, v_blocks), dim=-1)  # (B, H, N, b, 2Dh): one product
        mixed = torch.einsum("bhij,bhjrd->bhird", p, both)  # (B, H, N, b, 2Dh)
        mass = torch.einsum("bhij,bjr->bhir", p, valid[:, 0, :, :, 0].to(p.dtype))  # (B, H, N, b)
        return *mixed.chunk(2, dim=-1), mass

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
        b, h, t, dh = q.shape
        if k.shape[-2] != t or bias is not None:
            raise ValueError("sinkhorn attention sorts the blocks of one sequence: it takes no "
                             "extra keys and no additive bias")
        n, size = math.ceil(t / self.block), self.block
        if n > self.max_blocks:
            raise ValueError(f"sinkhorn attention: {t} positions make {n} blocks of {size}, but "
                             f"its sorting network scores {self.max_blocks} (data.seq_len)")
        valid = torch.ones(b, t, dtype=torch.bool, device=q.device)
        if key_padding_mask is not None:
            valid = ~key_padding_mask
        valid = F.pad(valid, (0, n * size - t), value=False).view(b, 1, n, size, 1)
        blocks = lambda x: F.pad(x, (0, 0, 0, n * size - t)).view(b, h, n, size, dh)  # noqa: E731
        q_blocks = blocks(q)  # (B, H, N, b, Dh)
        k_blocks, v_blocks = blocks(k) * valid, blocks(v) * valid  # (B, H, N, b, Dh), 0 at padding

        log_alpha = self.sort_logits(self.pool(k_blocks, valid, causal))  # (B, H, N, N)
        if self.training:  # Gumbel-Sinkhorn: sample a (soft) permutation
            uniform = torch.rand_like(log_alpha).clamp(1e-6, 1 - 1e-6)
            log_alpha = log_alpha - torch.log(-torch.log(uniform))
        allowed = torch.ones(n, n, dtype=torch.bool, device=q.device)
        if causal:
            allowed = allowed.tril(-1)  # block i borrows only from blocks j < i
        p = sinkhorn(log_alpha / self.temperature, allowed, self.iters, causal).to(q.dtype)

        sorted_k, sorted_v, mass = self.borrow(p, k_blocks, v_blocks, valid)
        keys = torch.cat((sorted_k, k_blocks), dim=3)  # (B, H, N, 2b, Dh)
        values = torch.cat((sorted_v, v_blocks), dim=3)  # (B, H, N, 2b, Dh)

        local = valid[..., 0][:, :, :, None, :]  # (B, 1, N, 1, b)
        if causal:
            local = local & torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        local = local.expand(b, h, n, size, size)  # (B, H, N, b, b)
        borrowed = (mass > 0)[:, :, :, None, :].expand(b, h, n, size, size)  # (B, H, N, b, b)
        allowed_keys = torch.cat((borrowed, local), dim=-1)  # (B, H, N, b, 2b)
        log_mass = mass.clamp(min=torch.finfo(mass.dtype).tiny).log()[:, :, :, None, :]
        slot_bias = torch.cat((log_mass, torch.zeros_like(log_mass)), dim=-1)  # (B, H, N, 1, 2b)
        scores = (q_blocks / math.sqrt(dh)) @ keys.transpose(-1, -2) + slot_bias  # (B, H, N, b, 2b)
        out, _ = softmax_attention(scores, allowed_keys, values)  # (B, H, N, b, Dh)
        return out.reshape(b, h, n * size, dh)[:, :, :t]  # (B, H, T, Dh)
