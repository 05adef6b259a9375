"""Universal Transformer with dynamic halting (Dehghani, Gouws, Vinyals, Uszkoreit & Kaiser
2019, ICLR): one block applied up to ``max_depth`` times, each position halting on its own by
Adaptive Computation Time (Graves 2016).

At step n = 1, 2, ... (the bookkeeping is :mod:`xformer_bench.stacks._act`)::

    a^n   = s^{n-1} + P^n                       s^0 = x, P^n the timestep embedding
    h^n   = sigmoid(w . a^n + b)                per position: the halting unit
    s^n   = Block(a^n)                          for positions still running; a halted
                                                position keeps its state
    y     = sum_n  w^n s^n                      w^n = h^n before halting, R at it, 0 after
    loss += tau * mean_t (N_t + R_t)            the ponder cost (training only)

* The halting unit reads the step's input after the timestep signal, as t2t's ``ut_act``
  (``step_preprocess`` then a sigmoid dense layer); its bias starts at ``halting_bias_init``
  = 1.0 (t2t's ``act_halting_bias_init``: h ~ 0.73, so every position starts at 2 steps) and
  its weight at N(0, 1), a unit-scale logit on xbench's D^-1/2-scale stream
  (``embedding/__init__.py``), about what t2t's Glorot-initialised layer gives on its stream.
* P^n is the paper's coordinate embedding over time (section 2.1): sinusoids of the step
  index n (1-based, as the paper's t), divided by sqrt(D) like xbench's sinusoidal positions
  (``position/sinusoidal.py``).  It is added at every step on top of the model's own position
  scheme, which is applied once (or inside attention) as for every stack.
* Halted positions keep their state (the paper's section 2.2: "its state is simply copied to
  the next step until all blocks halt, or we reach a maximum number of steps"), and the loop
  runs until every position has halted or ``max_depth``.  t2t's code instead keeps
  transforming a halted position's recurrent state and only zeroes its weight; with the copy,
  a position's output does not depend on how long other positions keep the loop running.
* The output is the halting-weighted sum of the step states, Graves' y = sum_n p^n y^n and
  t2t's ``act_type="accumulated"``; the listing's default (``basic``) interpolates instead,
  new = w s^n + (1 - w) new, whose effective weights need not sum to 1.
* Defaults (t2t's ``update_hparams_for_universal_transformer``): ``max_depth`` null =
  2 x model.n_layers (``act_max_steps``), ``threshold`` 0.99 (``act_epsilon`` 0.01),
  ``ponder_cost`` tau = 0.01 (``act_loss_weight``).

Causal: h^n of a position reads only its own state, which a causal block makes a function of
that position and earlier ones, so halting, weights and output are causal too.

Simplifications: dense -- the block runs on every position at every step and halted ones are
masked, so this measures the quality effect of adaptive depth, not a compute saving; the
ponder cost is averaged over all positions of the batch (padding included, none in the LM).
``report()`` gives ``ponder_steps``: the mean over positions of N (steps taken, not N + R) in
the last forward.  One block serves every step (``shares_blocks``; ``provides`` no
``unshared_blocks``), so parts keeping a per-layer running statistic are refused.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from xformer_bench.errors import ConfigError
from xformer_bench.core.context import ForwardContext
from xformer_bench.core.dims import ModelDims
from xformer_bench.registry import STACK
from xformer_bench.stacks import Stack, apply_block, recomputes
from xformer_bench.stacks._act import Halting


def timestep_signal(steps: int, d_model: int, base: float = 10000.0) -> torch.Tensor:
    """(steps + 1, D): row n is the sinusoid of step n (row 0 unused), divided by sqrt(D)."""
    step = torch.arange(steps + 1).unsqueeze(1)  # (S+1, 1)
    freq = torch.exp(torch.arange(0, d_model, 2) * (-math.log(base) / d_model))  # (D/2,)
    table = torch.zeros(steps + 1, d_model)
    table[:, 0::2] = torch.sin(step * freq)
    table[:, 1::2] = torch.cos(step * freq[: d_model // 2])
    return table / math.sqrt(d_model)


@STACK.register("universal")
class UniversalStack(Stack):
    provides = frozenset({"ordered_blocks"})
    shares_blocks = True  # one block at every depth, whatever model.share_blocks says: the
    # model's check then refuses parts keeping per-layer running statistics

    def __init__(self, dims: ModelDims, make_block: Callable[[], nn.Module],
                 share_blocks: bool = False, checkpointing: bool = False,
                 max_depth: int | None = None, threshold: float = 0.99,
                 ponder_cost: float = 0.01, halting_bias_init: float = 1.0):
        super().__init__()
        del share_blocks  # always one shared block
        self.max_depth = 2 * dims.n_layers if max_depth is None else max_depth
        if self.max_depth < 1:
            raise ConfigError(f"stack.max_depth={max_depth} must be at least 1 "
                              "(null: 2 x model.n_layers)")
        if not 0.0 < threshold <= 1.0:
            raise ConfigError(f"stack.threshold={threshold} must lie in (0, 1]: it is 1 - epsilon")
        if ponder_cost < 0:
            raise ConfigError(f"stack.ponder_cost={ponder_cost} must be >= 0")
        self.threshold, self.ponder_cost, self.checkpointing = threshold, ponder_cost, checkpointing
        self.blocks = nn.ModuleList([make_block()])
        self.halt_weight = nn.Parameter(torch.randn(dims.d_model))  # (D,) w of the halting unit
        self.halt_bias = nn.Parameter(torch.tensor(float(halting_bias_init)))  # b
        self.register_buffer("timesteps", timestep_signal(self.max_depth, dims.d_model),
                             persistent=False)  # (max_depth + 1, D)
        # The last forward, for report() and tests: (S, B, T) halting probabilities and
        # weights of the S steps run; (B, T) N and R; the ponder cost tau * mean(N + R).
        self.last_probabilities: torch.Tensor | None = None
        self.last_weights: torch.Tensor | None = None
        self.last_steps: torch.Tensor | None = None
        self.last_remainder: torch.Tensor | None = None
        self.last_ponder_cost: torch.Tensor | None = None

    def halting_probability(self, a: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T)
        """h = sigmoid(w . a + b), in float32 (not a matmul: autocast leaves it alone)."""
        return torch.sigmoid((a.float() * self.halt_weight.float()).sum(-1) + self.halt_bias)

    def forward(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:  # (B, T, D)
        recompute = recomputes(self)
        block = self.blocks[0]
        halting = Halting.start(x[..., 0])  # (B, T)
        state, output = x, torch.zeros_like(x)  # (B, T, D) each
        probabilities, weights = [], []
        for step in range(1, self.max_depth + 1):
            a = state + self.timesteps[step].to(state.dtype)  # (B, T, D)
            p = self.halting_probability(a)  # (B, T)
            running = (~halting.halted).unsqueeze(-1)  # (B, T, 1), before this step's halts
            weight = halting.update(p, self.threshold, final=step == self.max_depth)  # (B, T)
            new = apply_block(block, a, ctx, 0, recompute=recompute)  # (B, T, D)
            output = output + weight.unsqueeze(-1).to(new.dtype) * new
            state = torch.where(running, new, state)
            probabilities.append(p.detach())
            weights.append(weight.detach())
            if bool(halting.halted.all()):
                break
        ponder = self.ponder_cost * halting.ponder().mean()
        if self.training and self.ponder_cost:
            ctx.add_auxiliary_loss(ponder)
        self.last_probabilities = torch.stack(probabilities)
        self.last_weights = torch.stack(weights)
        self.last_steps, self.last_remainder = halting.steps, halting.remainder.detach()
        self.last_ponder_cost = ponder.detach()
        return output

    def report(self) -> dict[str, float]:
        """Mean over positions of N, the steps taken, in the last forward."""
        if self.last_steps is None:
            return {}
        return {"ponder_steps": self.last_steps.mean().item()}
