"""What every task optimises with: AdamW under the house schedule, and the divergence check."""

from __future__ import annotations

from functools import partial

import torch
from torch import nn

from xformer_bench.errors import DivergedError
from xformer_bench.tasks.schedule import lr_factor


def adamw_with_schedule(module: nn.Module, optim: dict, max_steps: int) -> dict:
    """AdamW; weight decay only on matrices (not biases, norms' gains or embeddings' rows
    shared with 1-D parameters); the learning rate warmed up and decayed per ``optim``
    (:func:`~xformer_bench.tasks.schedule.lr_factor`), stepped every optimiser step."""
    params = [p for p in module.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": optim["weight_decay"]},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=optim["lr"], betas=tuple(optim["betas"]),
                                  eps=optim["eps"])
    factor = partial(lr_factor, warmup_steps=optim["warmup_steps"], total_steps=max_steps,
                     decay=optim["decay"], min_lr_ratio=optim["min_lr_ratio"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def check_finite(loss: torch.Tensor, step: int) -> None:
    """:class:`DivergedError` when the training loss is NaN or infinite."""
    if not torch.isfinite(loss):
        raise DivergedError(f"training loss is {loss.item()} at step {step}; "
                            "lower optim.lr or raise optim.warmup_steps")
