"""Normalisation layers.  Builders take ``dim`` (the model width) plus the keys of their YAML
and return a module mapping (..., D) -> (..., D).

The :class:`~xformer_bench.models.block.Block` builds one norm per slot its placement uses
(pre / post / sandwich).  A norm may also shape the residual branch it sits on; it does so by
subclassing :class:`Norm`, which the Block asks for

* ``residual_gate()`` -- a module applied to the branch output before the residual add
  (ReZero's zero-initialised scalar, Fixup's scalar multiplier);
* ``init_residual_branch(branch, ...)`` -- a re-initialisation of the branch, run after the
  model's default initialisation (Fixup).

Plain modules (``nn.LayerNorm``) need neither: :func:`residual_gate` and
:func:`init_residual_branch` give them the defaults.
"""

from __future__ import annotations

import torch
from torch import nn


class Norm(nn.Module):
    """A norm that may gate or re-initialise the residual branch it normalises."""

    def residual_gate(self) -> nn.Module:
        """A fresh module applied to the branch output before the residual add."""
        return nn.Identity()

    def init_residual_branch(self, branch: nn.Module, *, n_branches: int, depth: int) -> None:
        """Re-initialise ``branch``, one of ``n_branches`` residual branches of the model,
        whose input passes through ``depth`` weight layers on its way to the output."""


def residual_gate(norm: nn.Module) -> nn.Module:
    return norm.residual_gate() if isinstance(norm, Norm) else nn.Identity()


def init_residual_branch(norm: nn.Module, branch: nn.Module, *, n_branches: int, depth: int) -> None:
    if isinstance(norm, Norm):
        norm.init_residual_branch(branch, n_branches=n_branches, depth=depth)


class ResidualScale(nn.Module):
    """``a * branch`` with one learnable scalar ``a`` (ReZero's alpha, Fixup's multiplier)."""

    def __init__(self, init: float):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(init)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        return self.scale * x


class ReZero(Norm):
    """An optional inner norm plus ReZero's residual gate: ``x + a * f(norm(x))`` with ``a``
    initialised at 0, so that every layer starts as the identity map (Bachlechner et al.
    2020).  With ``nn.Identity()`` inside it is ReZero proper; with a LayerNorm or RMSNorm
    inside it is the "ReZero + LayerNorm / RMS Norm" rows of Narang et al. (2021)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        return self.inner(x)

    def residual_gate(self) -> nn.Module:
        return ResidualScale(0.0)
