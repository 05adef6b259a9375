"""The sparse patterns through FlexAttention (Dong et al. 2024, "Flex Attention: A Programming
Model for Generating Optimized Attention Kernels"): a pattern is a ``mask_mod(b, h, q_idx,
kv_idx) -> bool``, ``create_block_mask`` records which 128 x 128 tiles hold any allowed pair,
and ``torch.compile(flex_attention)`` generates a fused kernel that skips the empty tiles and
masks the partial ones:  out_i = sum_{j : mask(i, j)} softmax_j(q_i k_j / sqrt(Dh)) v_j.

Each mask-expressible kernel (``local``, ``block_local``, ``dilated``, ``longformer``,
``bigbird``, ``strided``, ``fixed``) gives its (query, key) set as a frozen
:class:`WindowPattern` or :class:`FactorizedPattern` (``kernel.flex_pattern(t, s, causal, layer,
heads)``) and wraps its ``forward`` in :func:`flex_dispatch`.  Positions are absolute: the T
queries are the last T of the S keys, as in the hand-written kernels.

When: on CUDA, with no pair bias and no key padding mask, and T == S (a full pass; a decode
step over cached keys would compile per shape).  Everything else -- a bias (T5, ALiBi, Shaw),
key padding, decoding, CPU training -- runs the hand-written blockwise kernel.
``XBENCH_FLEX=0`` forbids flex, ``XBENCH_FLEX=1`` forces it wherever bias and padding are None
(any device, T != S too); the module switch :data:`FORCE` (True / False) overrides the variable.
On CPU flex has no backward: a pass that needs gradients stays hand-written even when forced,
and the CPU forward runs eagerly (unfused, the T x S scores materialised: for tests only).
Rows with no allowed key give 0, as the hand-written kernels do.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

FORCE: bool | None = None
"""True: flex wherever bias and padding allow; False: never; None: ``XBENCH_FLEX``, else auto."""

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class WindowPattern:
    """The :func:`~._window.windowed_attention` family: keys within ``before`` / ``after`` steps
    of ``dilation`` positions on the query's lane (``block`` 0, a sliding band), or around the
    query's aligned block of ``block`` positions (block-local, BigBird); the first ``n_global``
    positions attend and are attended by all; ``random[n]`` lists query block n's extra key
    blocks (BigBird, -1 = none)."""

    before: int
    after: int
    dilation: int = 1
    block: int = 0
    n_global: int = 0
    random: tuple[tuple[int, ...], ...] = ()
    heads: int = 0  # > 0: the pattern differs by head (never, here)

    def mask_mod(self, t: int, s: int, causal: bool, device: torch.device) -> MaskMod:
        offset, d = s - t, self.dilation
        table = None
        if self.random:  # (nb, nb) bool: query block -> its random key blocks
            listed = torch.tensor(self.random, device=device)  # (nb, r)
            table = torch.zeros(len(self.random), len(self.random) + 1, dtype=torch.bool,
                                device=device)
            table.scatter_(1, listed.masked_fill(listed < 0, len(self.random)), True)
            last = len(self.random) - 1

        def allowed(b, h, q_idx, kv_idx):
            p, j = q_idx + offset, kv_idx
            if self.block:  # the keys around the query's aligned block
                first = (p // self.block) * self.block
                near = (j >= first - self.before) & (j < first + self.block + self.after)
            else:  # the band on the query's lane
                step = p - j
                near = (step % d == 0) & (step <= self.before * d) & (-step <= self.after * d)
            keep = near | (j < self.n_global) | (p < self.n_global)
            if table is not None:
                keep = keep | table[(p // self.block).clamp(max=last),
                                    (j // self.block).clamp(max=last)]
            return keep & (j <= p) if causal else keep

        return allowed


@dataclass(frozen=True)
class FactorizedPattern:
    """The Sparse Transformer's factorisations (Child et al. 2019, §4.3) on rows of ``width``
    (l): ``strided`` A1 = {|i - j| < l} (causal: 0 <= i - j < l), A2 = {(i - j) mod l = 0};
    ``fixed`` A1 = {floor(j / l) = floor(i / l)}, A2 = {j mod l >= l - c}; combined by ``mode`` as in :mod:`._factorized`
    (merged: A1 u A2; interleaved: A1 at even layers, A2 at odd; multihead: the first ceil(H/2)
    heads A1)."""

    kind: str  # strided | fixed
    width: int
    summary: int = 1  # c (fixed)
    mode: str = "merged"
    layer: int = 0
    heads: int = 0

    def __post_init__(self):  # only what changes the mask is kept, so the cache hits
        object.__setattr__(self, "layer", self.layer % 2 if self.mode == "interleaved" else 0)
        object.__setattr__(self, "heads", self.heads if self.mode == "multihead" else 0)

    def mask_mod(self, t: int, s: int, causal: bool, device: torch.device) -> MaskMod:
        offset, l, c = s - t, self.width, self.summary

        def allowed(b, h, q_idx, kv_idx):
            p, j = q_idx + offset, kv_idx
            if self.kind == "strided":
                a1, a2 = (p - j < l) & (j - p < l), (p - j) % l == 0
            else:
                a1, a2 = p // l == j // l, j % l >= l - c
            if self.mode == "merged":
                keep = a1 | a2
            elif self.mode == "interleaved":
                keep = a2 if self.layer else a1
            else:
                keep = torch.where(h < (self.heads + 1) // 2, a1, a2)
            return keep & (j <= p) if causal else keep

        return allowed


Pattern = WindowPattern | FactorizedPattern


@functools.lru_cache(maxsize=64)
def block_mask(pattern: Pattern, t: int, s: int, causal: bool,
               device: torch.device) -> BlockMask:
    """The pattern's block mask, built once per (pattern, T, S, causal, device)."""
    return create_block_mask(pattern.mask_mod(t, s, causal, device), None,
                             pattern.heads or None, t, s, device=device)


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor]:
    """``torch.compile(flex_attention)``, once per process.  Every (pattern, shape) is a guard
    of the one compiled function: the recompile limit is raised so that none falls back to the
    unfused eager path."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    return torch.compile(flex_attention)


def flex_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: Pattern, *,
                 causal: bool) -> torch.Tensor:  # (B, H, T, Dh)
    """Softmax attention over the pattern's pairs through flex (compiled on CUDA)."""
    mask = block_mask(pattern, q.shape[-2], k.shape[-2], causal, q.device)
    attend = _compiled_flex() if q.is_cuda else flex_attention
    return attend(q, k, v, block_mask=mask)


def use_flex(q: torch.Tensor, k: torch.Tensor, bias, key_padding_mask) -> bool:
    """Whether this call goes through flex (module docstring)."""
    if bias is not None or key_padding_mask is not None:
        return False
    if not q.is_cuda and torch.is_grad_enabled() and any(x.requires_grad for x in (q, k)):
        return False  # no flex backward on CPU
    setting = FORCE if FORCE is not None else {"0": False, "1": True}.get(
        os.environ.get("XBENCH_FLEX", ""))
    return setting if setting is not None else q.is_cuda and q.shape[-2] == k.shape[-2]


def flex_dispatch(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps a kernel's hand-written ``forward``: flex when :func:`use_flex` says so."""

    @functools.wraps(forward)
    def dispatch(self, q, k, v, *, causal, bias=None, key_padding_mask=None, layer=0):
        if (use_flex(q, k, bias, key_padding_mask)
                and (causal or "bidirectional" in self.provides)):
            pattern = self.flex_pattern(q.shape[-2], k.shape[-2], causal, layer, q.shape[1])
            return flex_forward(q, k, v, pattern, causal=causal)
        return forward(self, q, k, v, causal=causal, bias=bias,
                       key_padding_mask=key_padding_mask, layer=layer)

    return dispatch


def dense_mask(pattern: Pattern, t: int, s: int, causal: bool, heads: int = 1) -> torch.Tensor:
    """(H, T, S) bool: the pattern's mask_mod evaluated on every pair (for tests and checks)."""
    mod = pattern.mask_mod(t, s, causal, torch.device("cpu"))
    h = torch.arange(heads)[:, None, None]
    return mod(torch.zeros(()), h, torch.arange(t)[None, :, None], torch.arange(s)).expand(
        heads, t, s)


__all__ = ["FORCE", "FactorizedPattern", "WindowPattern", "block_mask", "dense_mask",
           "flex_dispatch", "flex_forward", "use_flex"]
