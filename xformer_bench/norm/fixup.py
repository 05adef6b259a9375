"""Fixup (Zhang, Dauphin & Ma 2019, "Fixup Initialization: Residual Learning Without
Normalization"): no normalisation; instead

1. the last layer of every residual branch starts at zero, so every block starts as the
   identity map;
2. the branch's other weight layers keep the model's standard initialisation scaled by
   ``L ** (-1 / (2m - 2))``, with ``L`` the number of residual branches and ``m`` the number
   of weight layers the branch multiplies together (the Block declares ``m``: 4 for attention
   -- query, key, value, output, as the authors' Transformer code counts it -- and 2 for the
   feed-forward layer);
3. learnable scalars: a bias added to the branch input (this module's forward, so it also
   sits before the output layer when used as the model's final norm) and a multiplier,
   initialised at 1, on the branch output (the residual gate).

Simplifications, stated honestly: the paper also adds scalar biases *inside* each branch
(before every linear layer and activation); here every linear layer already carries a full
bias vector that absorbs such a shift, so they are left out.  The classification layer is not
zero-initialised because the output projection shares its weights with the input embedding.
A branch's last layer is found by the name the codebase gives residual output projections
(``out`` for attention, ``down`` for feed-forward layers); Fixup declares that it needs one
(``requires``), so a branch without one is a ConfigError when the model is built.
Intended for ``model.norm_placement=pre`` (in ``post`` the scalar bias sits on the residual
stream instead of the branch input).
"""

from __future__ import annotations

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.init import RESIDUAL_OUTPUTS
from xformer_bench.norm import Norm, ResidualScale
from xformer_bench.registry import NORM

def _is_residual_output(parameter_name: str) -> bool:
    owner_and_name = parameter_name.split(".")[-2:]  # ("out", "weight") or ("down",)
    return any(part in RESIDUAL_OUTPUTS for part in owner_and_name)


def fixup_scale(n_branches: int, depth: int) -> float:
    """``L ** (-1 / (2m - 2))``, the factor for the branch's non-final weight layers."""
    if depth < 2:
        raise ValueError(f"Fixup needs branches of at least 2 weight layers, got depth={depth}")
    return n_branches ** (-1.0 / (2 * depth - 2))


class Fixup(Norm):
    requires = {"attention": frozenset({"residual_output"}), "ffn": frozenset({"residual_output"})}

    def __init__(self):
        super().__init__()
        self.input_bias = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D)
        return x + self.input_bias

    def residual_gate(self) -> nn.Module:
        return ResidualScale(1.0)

    @torch.no_grad()
    def init_residual_branch(self, branch: nn.Module, *, n_branches: int, depth: int) -> None:
        scale = fixup_scale(n_branches, depth)
        if not any(_is_residual_output(name) for name, _ in branch.named_parameters()):
            raise ConfigError(
                f"norm=fixup cannot initialise {type(branch).__name__}: it has no residual output "
                f"layer named {' or '.join(RESIDUAL_OUTPUTS)} to zero; choose another norm or ffn"
            )
        for name, p in branch.named_parameters():
            if _is_residual_output(name):
                p.zero_()
            elif p.dim() >= 2:  # weight matrices; biases stay at zero
                p.mul_(scale)


@NORM.register("fixup")
def build(dim: int) -> nn.Module:
    del dim  # nothing is normalised: only scalar parameters
    return Fixup()
