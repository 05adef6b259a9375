"""How a sublayer's output joins the residual stream (``model.residual``).

* ``add``      -- ``x + y``, the Transformer's residual connection.
* ``gru_gate`` -- GTrXL's gating layer (Parisotto et al. 2020, "Stabilizing Transformers for
  Reinforcement Learning", ICML, section 3.2, the GRU-type gate of eq. (8)): with ``x`` the
  stream and ``y = ReLU(sublayer output)`` (the paper applies a ReLU to each submodule's output
  before gating, its "identity map reordering"),

      r = sigmoid(W_r y + U_r x)
      z = sigmoid(W_z y + U_z x - b_g)
      h = tanh(W_g y + U_g (r * x))
      g(x, y) = (1 - z) * x + z * h.

  ``b_g`` (:data:`GATE_BIAS`, the paper's best value, 2) pushes the update gate ``z`` towards 0 at
  initialisation, so every layer starts close to the identity map.  The six D x D matrices
  (three W, three U; bias-free, the paper's equations have none but b_g) are fused into two.

A norm's gate (ReZero, Fixup) still scales the sublayer output before it reaches the residual;
``model.norm_placement`` still decides where norms sit.  The survey's GTrXL pairs the gate with
pre-LN placement (its "identity map reordering"), the default here.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.errors import ConfigError

RESIDUALS = ("add", "gru_gate")
GATE_BIAS = 2.0


class ResidualAdd(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (B, T, D) each
        return x + y


class GRUGate(nn.Module):
    def __init__(self, d_model: int, gate_bias: float = GATE_BIAS):
        super().__init__()
        self.from_branch = nn.Linear(d_model, 3 * d_model, bias=False)  # [W_r; W_z; W_g]
        self.from_stream = nn.Linear(d_model, 2 * d_model, bias=False)  # [U_r; U_z]
        self.reset_stream = nn.Linear(d_model, d_model, bias=False)  # U_g, applied to r * x
        self.gate_bias = gate_bias

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # (B, T, D) each
        y = torch.relu(y)
        w_r, w_z, w_g = self.from_branch(y).chunk(3, dim=-1)  # (B, T, D) each
        u_r, u_z = self.from_stream(x).chunk(2, dim=-1)  # (B, T, D) each
        r = torch.sigmoid(w_r + u_r)
        z = torch.sigmoid(w_z + u_z - self.gate_bias)
        h = torch.tanh(w_g + self.reset_stream(r * x))
        return torch.lerp(x, h, z)  # (1 - z) x + z h


def residual_factory(kind: str, d_model: int) -> Callable[[], nn.Module]:
    """What makes each sublayer's residual join for ``model.residual=kind``."""
    if kind == "add":
        return ResidualAdd
    if kind == "gru_gate":
        return lambda: GRUGate(d_model)
    raise ConfigError(f"model.residual={kind!r}: choose one of {', '.join(RESIDUALS)}")
