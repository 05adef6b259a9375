"""The autograd machinery of ``stack=reversible``: the RevNet coupling over a whole stack, run
forward without keeping activations and inverted layer by layer in the backward pass (Gomez,
Ren, Urtasun & Grosse 2017, "The Reversible Residual Network", Algorithm 1; Kitaev, Kaiser &
Levskaya 2020, "Reformer", section 3).

Layer l maps (X1, X2) to

    Y1 = X1 + F_l(X2)        F: the attention branch
    Y2 = X2 + G_l(Y1)        G: the feed-forward branch (in ``chunks`` pieces along T).

:class:`ReversibleCoupling` runs all layers in its forward (no graph) and saves only the last
(Y1, Y2).  Its backward walks the layers in reverse: it recomputes G_l(Y1) with grad,
``X2 = Y2 - G_l(Y1)``, then F_l(X2), ``X1 = Y1 - F_l(X2)``, and backpropagates through each
recomputed branch with ``torch.autograd.grad`` (w.r.t. the branch input and the parameters),
so at most one branch's graph exists at a time: activation memory does not grow with depth.

A recomputed branch must be the function the forward applied.  Before each branch the
forward records a :class:`Replay`: the CPU (and CUDA) RNG state, as ``torch.utils.checkpoint``
does with ``preserve_rng_state`` (dropout, LSH's random rotations, Gumbel noise draw the same
numbers), the autocast state, and the state of the block's modules -- its buffers and plain
number attributes -- because some parts change themselves in a training forward (PowerNorm's
running statistic; routing attention records its k-means
statistics outside any backward replay and moves its centroids after the optimiser step,
:mod:`xformer_bench.core.step_updates`).  The
recompute runs from that state in a forked RNG and the block's state is put back afterwards:
the recompute leaves neither the global RNG nor any statistic changed (updated once, not twice).

Auxiliary losses (expert load balancing, adaptive span's penalty) a branch adds to the
context are returned as extra outputs of the Function, one per branch application that added
any (their sum; over chunks, their mean, so ``chunks`` does not scale the objective), and their
gradients join the branch's in the backward recompute.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from xformer_bench.core.context import ForwardContext


@dataclass(frozen=True)
class Branch:
    """One residual branch of the coupling, ``(B, t, D) -> (B, t, D)``, ready to call."""

    fn: Callable[[torch.Tensor, ForwardContext], torch.Tensor]  # sets ctx.layer itself
    owner: nn.Module  # the block: whose state a recompute replays
    params: tuple[int, ...]  # indices into the Function's parameters that fn may use
    chunks: int = 1  # pieces along T, computed one after another (position-wise branches only)


_MODULE_INTERNALS = frozenset(vars(nn.Module()))  # hooks, flags, training: not layer state


class ModuleState:
    """The mutable state of a module tree: buffer values and plain number attributes."""

    def __init__(self, owner: nn.Module):
        self.entries = [
            (m, {k: v for k, v in vars(m).items()
                 if type(v) in (int, float, bool) and k not in _MODULE_INTERNALS},
             {k: b.detach().clone() for k, b in m.named_buffers(recurse=False) if b is not None})
            for m in owner.modules()]

    @torch.no_grad()
    def restore(self) -> None:
        for module, numbers, buffers in self.entries:
            vars(module).update(numbers)
            for name, value in buffers.items():
                getattr(module, name).copy_(value)


@dataclass
class Replay:
    """What a branch application needs to be recomputed exactly (recorded before it runs)."""

    cpu_rng: torch.Tensor
    cuda_rng: torch.Tensor | None
    autocast: tuple[bool, torch.dtype]
    state: ModuleState
    aux: int | None = None  # index of its auxiliary loss among the Function's extra outputs

    @classmethod
    def record(cls, owner: nn.Module, device: torch.device) -> Replay:
        cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        autocast = (torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type))
        return cls(torch.get_rng_state(), cuda, autocast, ModuleState(owner))

    @contextmanager
    def replaying(self, owner: nn.Module, device: torch.device):
        """Run the body from the recorded RNG, autocast and module state; leave the current
        ones as they were."""
        current = ModuleState(owner)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.set_rng_state(self.cpu_rng)
            if self.cuda_rng is not None:
                torch.cuda.set_rng_state(self.cuda_rng, device)
            self.state.restore()
            enabled, dtype = self.autocast
            try:
                with torch.autocast(device.type, dtype=dtype, enabled=enabled):
                    yield
            finally:
                current.restore()


def apply_branch(branch: Branch, x: torch.Tensor, ctx: ForwardContext
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``branch(x)`` chunk by chunk along T, and the auxiliary loss it added (or None)."""
    outer, ctx.aux_losses = ctx.aux_losses, []
    try:
        pieces = [branch.fn(piece, ctx) for piece in x.chunk(branch.chunks, dim=1)]  # (B, t_i, D)
        losses = ctx.aux_losses
    finally:
        ctx.aux_losses = outer
    aux = torch.stack(losses).sum() / len(pieces) if losses else None
    return _join(pieces), aux  # (B, T, D)


def couple(layers: Sequence[tuple[Branch, Branch]], x1: torch.Tensor, x2: torch.Tensor,
           ctx: ForwardContext, replays: list[Replay] | None = None
           ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The coupling's forward (with whatever grad mode is on); with ``replays``, record one
    :class:`Replay` per branch application."""
    losses: list[torch.Tensor] = []

    def run(branch: Branch, x: torch.Tensor) -> torch.Tensor:
        if replays is not None:
            replays.append(Replay.record(branch.owner, x.device))
        y, aux = apply_branch(branch, x, ctx)
        if aux is not None:
            if replays is not None:
                replays[-1].aux = len(losses)
            losses.append(aux)
        return y

    for f, g in layers:
        x1 = x1 + run(f, x2)  # Y1 = X1 + F(X2), (B, T, D)
        x2 = x2 + run(g, x1)  # Y2 = X2 + G(Y1), (B, T, D)
    return x1, x2, losses


class ReversibleCoupling(torch.autograd.Function):
    """``(x1, x2, *params) -> (y1, y2, *aux_losses)``; keeps only ``y1``, ``y2`` (and the
    per-branch :class:`Replay` records) for the backward pass."""

    @staticmethod
    def forward(fctx, layers: Sequence[tuple[Branch, Branch]], ctx: ForwardContext,
                x1: torch.Tensor, x2: torch.Tensor, *params: torch.Tensor):
        replays: list[Replay] = []
        # A context of its own: the caller's will hold the auxiliary losses this returns, and
        # a context kept here holding outputs of this node would be a cycle no GC can see.
        ctx = copy.copy(ctx)
        ctx.aux_losses = []
        x1, x2 = x1.detach(), x2.detach()  # (B, T, D) each; no graph is built in here
        y1, y2, losses = couple(layers, x1, x2, ctx, replays)
        fctx.save_for_backward(y1, y2)
        fctx.layers, fctx.ctx, fctx.params, fctx.replays = layers, ctx, params, replays
        return (y1, y2, *losses)

    @staticmethod
    @once_differentiable
    def backward(fctx, grad_y1: torch.Tensor, grad_y2: torch.Tensor, *grad_losses: torch.Tensor):
        y1, y2 = fctx.saved_tensors  # (B, T, D) each
        params, replays = fctx.params, iter(reversed(fctx.replays))
        param_grads: list[torch.Tensor | None] = [None] * len(params)
        for f, g in reversed(fctx.layers):
            replay_g, replay_f = next(replays), next(replays)
            g_y1, grad_from_g = _backprop(g, replay_g, y1, grad_y2, grad_losses, fctx, param_grads)
            x2 = y2 - g_y1  # X2 = Y2 - G(Y1)
            grad_y1 = grad_y1 + grad_from_g  # dL/dY1 in full: directly and through G
            f_x2, grad_from_f = _backprop(f, replay_f, x2, grad_y1, grad_losses, fctx, param_grads)
            x1 = y1 - f_x2  # X1 = Y1 - F(X2)
            y1, y2, grad_y2 = x1, x2, grad_y2 + grad_from_f  # dL/dX1 = dL/dY1 (unchanged)
        return (None, None, grad_y1, grad_y2, *param_grads)


def _backprop(branch: Branch, replay: Replay, x: torch.Tensor, grad_out: torch.Tensor,
              grad_losses: Sequence[torch.Tensor], fctx, param_grads: list[torch.Tensor | None]
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Recompute ``branch(x)`` as the forward ran it and backpropagate ``grad_out`` (and its
    auxiliary loss's gradient) through it, chunk by chunk: ``(branch(x), dL/dx)`` detached;
    the parameters' gradients are added to ``param_grads``."""
    ctx, params = fctx.ctx, [fctx.params[i] for i in branch.params]
    pieces = x.chunk(branch.chunks, dim=1)
    grad_aux = None if replay.aux is None else grad_losses[replay.aux] / len(pieces)
    outputs, grads_in = [], []  # per piece: (B, t_i, D)
    outer = ctx.aux_losses
    try:
        with replay.replaying(branch.owner, x.device), torch.enable_grad():
            for piece, grad_piece in zip(pieces, grad_out.chunk(branch.chunks, dim=1)):
                piece = piece.detach().requires_grad_()  # (B, t_i, D)
                ctx.aux_losses = []
                # A view as the input: module hooks (FlopCounterMode's tracker) cannot watch a
                # leaf inside autograd.grad.
                y = branch.fn(piece.view_as(piece), ctx)  # (B, t_i, D)
                pairs = [(y, grad_piece)]
                if grad_aux is not None:
                    pairs += [(loss, grad_aux) for loss in ctx.aux_losses]
                pairs = [(o, d) for o, d in pairs if o.requires_grad]
                got = (torch.autograd.grad([o for o, _ in pairs], [piece, *params],
                                           [d for _, d in pairs], allow_unused=True)
                       if pairs else [None] * (1 + len(params)))
                outputs.append(y.detach())
                grads_in.append(torch.zeros_like(piece) if got[0] is None else got[0])
                for i, grad in zip(branch.params, got[1:]):
                    if grad is not None:
                        param_grads[i] = grad if param_grads[i] is None else param_grads[i] + grad
    finally:
        ctx.aux_losses = outer
    return _join(outputs), _join(grads_in)  # (B, T, D) each


def _join(pieces: list[torch.Tensor]) -> torch.Tensor:  # (B, t_i, D) each -> (B, T, D)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
