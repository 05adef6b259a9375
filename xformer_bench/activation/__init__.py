"""Feed-forward layers, chosen by their activation.  Builders take ``dims`` plus the keys
of their YAML and return a module mapping (B, T, D) -> (B, T, D).

Two shapes cover every variant; a variant file names its activation and picks one:

* :class:`FeedForward` -- ``W2 act(W1 x)`` (Vaswani et al. 2017);
* :class:`GatedFeedForward` -- ``W2 (act(W x) * V x)``, the gated linear units of
  Dauphin et al. (2017) as generalised by Shazeer (2020), "GLU Variants Improve Transformer".
  Shazeer defines them without biases (``FFN_GEGLU(x, W, V, W2) = (GELU(xW) * xV) W2``); so do
  the GLU YAMLs (``bias: false``), which also keeps LiGLU a bilinear form.  ``bias: true``
  adds a bias to ``W``, ``V`` and ``W2``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims

PARAM_MATCHED_SCALE = 2 / 3
"""Hidden-width factor that gives a gated layer (three matrices) the parameter count of
the non-gated one (two matrices), as in Shazeer (2020) and Narang et al. (2021)."""


class FeedForward(nn.Module):
    """``W2 act(W1 x)``: the position-wise feed-forward layer of the Transformer."""

    provides = frozenset({"dense_feedforward"})

    def __init__(self, dims: ModelDims, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.up = nn.Linear(dims.d_model, dims.d_ff)
        self.down = nn.Linear(dims.d_ff, dims.d_model)
        self.act = act

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        return self.down(self.act(self.up(x)))  # (B, T, D); position-wise: ctx unused


class GatedFeedForward(nn.Module):
    """``W2 (act(W x) * V x)``: a gated linear unit feed-forward layer.

    The hidden width is ``round(d_ff * d_ff_scale)``; the gate ``W`` and the value ``V``
    projections are fused into one matrix ``gate_up`` (gate rows first, then value rows),
    so the input is read once.  Bias-free by default, as in Shazeer (2020): with
    ``d_ff_scale`` 2/3 it has ``3 D round(2 d_ff / 3)`` parameters against the dense layer's
    ``2 D d_ff + d_ff + D``: the dense layer's biases, about ``1 / (2 D)`` of its count.
    """

    provides = frozenset({"dense_feedforward"})

    def __init__(
        self,
        dims: ModelDims,
        act: Callable[[torch.Tensor], torch.Tensor],
        d_ff_scale: float = PARAM_MATCHED_SCALE,
        bias: bool = False,
    ):
        super().__init__()
        self.hidden = round(dims.d_ff * d_ff_scale)
        if self.hidden < 1:
            raise ValueError(
                f"activation.d_ff_scale={d_ff_scale} with model.d_ff={dims.d_ff} "
                "leaves no hidden units"
            )
        self.gate_up = nn.Linear(dims.d_model, 2 * self.hidden, bias=bias)
        self.down = nn.Linear(self.hidden, dims.d_model, bias=bias)
        self.act = act

    def forward(self, x: torch.Tensor, ctx: ForwardContext | None = None) -> torch.Tensor:
        gate, value = self.gate_up(x).chunk(2, dim=-1)  # each (B, T, hidden)
        return self.down(self.act(gate) * value)  # (B, T, D)
