"""What every task optimises with: AdamW under the house schedule, the check of its settings
(``optim.*`` and ``trainer.max_steps``, when the task is built: before training or any record),
and the divergence check."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from numbers import Integral, Real

import torch
from torch import nn

from xformer_bench.errors import ConfigError, DivergedError
from xformer_bench.tasks.schedule import DECAYS, lr_factor


def _number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _count(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


OPTIM_RULES: tuple[tuple[str, Callable[[object], bool], str], ...] = (
    ("warmup_steps", lambda v: _count(v) and v >= 0,
     "must be 0 or a positive integer (the steps of linear warm-up)"),
    ("lr", lambda v: _number(v) and v > 0,
     "must be a positive number (the peak learning rate, e.g. optim.lr=3e-3)"),
    ("decay", lambda v: v in DECAYS, f"is not a schedule; choose one of: {', '.join(DECAYS)}"),
    ("min_lr_ratio", lambda v: _number(v) and 0 <= v <= 1,
     "must be between 0 and 1 (the final learning rate as a fraction of optim.lr)"),
    ("weight_decay", lambda v: _number(v) and v >= 0, "must be 0 or a positive number"),
    ("eps", lambda v: _number(v) and v > 0, "must be a positive number (e.g. optim.eps=1e-8)"),
)
"""``(key of optim, valid(value), what to write instead)``, in the order checked: the warm-up
before the rate, since a preset's rate may be derived from it (``${vaswani_lr:...}``)."""


def check_optimization(optim: dict, max_steps: int) -> None:
    """:class:`ConfigError` naming the fix for a setting the optimiser or its schedule cannot
    use; the keys of ``optim`` that are given are checked (a task built by hand may give none)."""
    if not (_count(max_steps) and max_steps >= 1):
        raise ConfigError(f"trainer.max_steps={max_steps} must be at least 1 (the optimiser "
                          "steps to train, e.g. trainer.max_steps=600)")
    for key, valid, fix in OPTIM_RULES:
        if key in optim and not valid(optim[key]):
            raise ConfigError(f"optim.{key}={optim[key]} {fix}")


NO_WEIGHT_DECAY = "_no_weight_decay"
"""A parameter with this attribute set true (``p._no_weight_decay = True``, by the module that
owns it, as safari's ``_optim``) is never decayed, matrix or not: e.g. hyena's implicit filter.
A mark on the built model's own parameters (``copy.deepcopy`` of a Parameter drops it)."""


def decays(p: torch.Tensor) -> bool:
    """Whether AdamW decays ``p``: a matrix (dim >= 2) not marked :data:`NO_WEIGHT_DECAY`."""
    return p.dim() >= 2 and not getattr(p, NO_WEIGHT_DECAY, False)


def adamw_with_schedule(module: nn.Module, optim: dict, max_steps: int) -> dict:
    """AdamW; weight decay only on matrices (not biases, norms' gains or embeddings' rows
    shared with 1-D parameters, nor a parameter marked :data:`NO_WEIGHT_DECAY`); the learning
    rate warmed up and decayed per ``optim`` (:func:`~xformer_bench.tasks.schedule.lr_factor`),
    stepped every optimiser step."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if decays(p)], "weight_decay": optim["weight_decay"]},
        {"params": [p for p in params if not decays(p)], "weight_decay": 0.0},
    ]
    on_gpu = bool(params) and all(p.is_cuda for p in params)  # one fused kernel a step there
    optimizer = torch.optim.AdamW(groups, lr=optim["lr"], betas=tuple(optim["betas"]),
                                  eps=optim["eps"], fused=on_gpu or None)
    factor = partial(lr_factor, warmup_steps=optim["warmup_steps"], total_steps=max_steps,
                     decay=optim["decay"], min_lr_ratio=optim["min_lr_ratio"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def check_finite(loss: torch.Tensor, step: int, strategy=None) -> None:
    """:class:`DivergedError` when the training loss is NaN or infinite -- on any rank, with
    a distributed ``strategy`` (every rank stops together, none waits on the others)."""
    bad = not bool(torch.isfinite(loss))
    if strategy is not None and getattr(strategy, "world_size", 1) > 1:
        bad = bool(strategy.reduce_boolean_decision(bad, all=False))
    if bad:
        value = loss.item() if not torch.isfinite(loss) else "finite here, not on another rank"
        raise DivergedError(f"training loss is {value} at step {step}; "
                            "lower optim.lr or raise optim.warmup_steps")
