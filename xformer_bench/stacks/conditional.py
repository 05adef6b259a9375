"""Conditional computation over depth: a learned gate per layer and token decides whether the
layer runs for that token (the survey's "conditional computation"; the per-token, per-layer
gate and the compute budget follow Bapna, Arivazhagan & Firat 2020, "Controlling Computation
versus Quality for Neural Sequence Models"; Elbayad et al. 2020, "Depth-Adaptive Transformer",
adapt depth per token by exiting instead of skipping).

For layer l = 1 .. n_layers and position t, with x_t the layer's input state::

    g_l(x_t) = sigmoid(w_l . x_t + b_l)                       the gate, one per (l, t)
    training:   x_t <- x_t + g_l(x_t) (Block_l(x)_t - x_t)    soft gate
    evaluation: x_t <- Block_l(x)_t if g_l(x_t) > 0.5 else x_t   hard gate: run or skip
    loss += budget_weight * (mean_{l,b,t} g - target_fraction)^2     (training only)

* Training uses the continuous gate and evaluation the discrete one, as Bapna et al. do
  (they add noise to the gate's pre-activation in training to push it towards 0 or 1; that
  noise is left out here).  The budget term is a choice of this benchmark: a squared gap
  between the mean gate and ``target_fraction``, so that on average that fraction of the
  layers runs -- Bapna et al. train against several budgets at once, not one.
* Gate weights start at 0 and biases at ``gate_bias_init`` = +3, g = sigmoid(3) ~ 0.95: every
  layer starts open for every token, the model a standard stack at first.
* ``target_fraction`` 0.5 and ``budget_weight`` 1.0 are choices, not paper values.
* Blocks are unshared unless ``model.share_blocks`` (the model's check then refuses parts
  keeping per-layer statistics); the
  gates are per depth either way.

Causal: g_l reads only position t's own state, so the stack is as causal as its blocks.

Dense: every block still runs on every token and a skipped token's result is discarded, so
this measures the quality effect of skipping layers, not the compute it would save.
``report()``: ``executed_fraction`` -- the fraction of (layer, position) pairs with
g > 0.5 in the last forward (exactly what ran, in evaluation) -- and ``mean_gate``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import STACK
from xformer_bench.stacks import Stack, apply_block, recomputes


@STACK.register("conditional")
class ConditionalStack(Stack):
    provides = frozenset({"ordered_blocks"})

    def __init__(self, dims: ModelDims, make_block: Callable[[], nn.Module],
                 share_blocks: bool = False, checkpointing: bool = False,
                 target_fraction: float = 0.5, budget_weight: float = 1.0,
                 gate_bias_init: float = 3.0):
        super().__init__()
        if not 0.0 <= target_fraction <= 1.0:
            raise ConfigError(f"stack.target_fraction={target_fraction} must lie in [0, 1]")
        if budget_weight < 0:
            raise ConfigError(f"stack.budget_weight={budget_weight} must be >= 0")
        self.n_layers, self.share_blocks, self.checkpointing = (
            dims.n_layers, share_blocks, checkpointing)
        self.target_fraction, self.budget_weight = target_fraction, budget_weight
        self.blocks = nn.ModuleList(
            make_block() for _ in range(1 if share_blocks else dims.n_layers))
        self.gate_weight = nn.Parameter(torch.zeros(dims.n_layers, dims.d_model))  # (L, D)
        self.gate_bias = nn.Parameter(torch.full((dims.n_layers,), float(gate_bias_init)))  # (L,)
        self.last_gates: torch.Tensor | None = None  # (L, B, T), the last forward's gates

    def gate(self, layer: int, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T)
        """g_l = sigmoid(w_l . x + b_l), in float32 (not a matmul: autocast leaves it alone)."""
        return torch.sigmoid((x.float() * self.gate_weight[layer].float()).sum(-1)
                             + self.gate_bias[layer])

    def budget_loss(self, gates: torch.Tensor) -> torch.Tensor:  # (L, B, T) -> ()
        return self.budget_weight * (gates.mean() - self.target_fraction) ** 2

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        recompute = recomputes(self)
        gates = []
        for i in range(self.n_layers):
            layer = 0 if self.share_blocks else i
            g = self.gate(i, x)  # (B, T)
            y = apply_block(self.blocks[layer], x, ctx, layer, recompute=recompute)
            if self.training:
                x = x + g.unsqueeze(-1).to(y.dtype) * (y - x)
            else:
                x = torch.where((g > 0.5).unsqueeze(-1), y, x)
            gates.append(g)
        stacked = torch.stack(gates)  # (L, B, T)
        if self.training and self.budget_weight:
            ctx.add_auxiliary_loss(self.budget_loss(stacked))
        self.last_gates = stacked.detach()
        return x

    def report(self) -> dict[str, float]:
        if self.last_gates is None:
            return {}
        return {"executed_fraction": (self.last_gates > 0.5).float().mean().item(),
                "mean_gate": self.last_gates.mean().item()}
