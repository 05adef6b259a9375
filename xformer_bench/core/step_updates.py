"""Module state that moves once per optimiser step, outside the differentiated forward pass.

A part whose state follows statistics of its activations (routing attention's online k-means
centroids, Roy et al. 2021) must not move it inside ``forward``: activation checkpointing
(``model.checkpointing``) runs the forward again during backward, which would count the batch
twice and recompute with the moved state -- another graph, ``CheckpointError``.  Such a part
records its statistics in forward, except in that replay (:func:`recomputing`), and defines
``apply_pending_updates()``; the training loop calls :func:`apply_pending_updates` on the model
after each optimiser step (``Task.optimizer_step``; a hand-written loop calls it likewise), so
the forwards of one step (gradient accumulation) pool into one update.

State that changes what the *next* step computes, but must not change what an evaluation after
this step sees (Performer's redrawn features), is applied before the next training step instead:
a part defines ``before_training_step()`` and the loop calls :func:`prepare_training_step`
before each training batch (``Task.on_train_batch_start``).
"""

from __future__ import annotations

import torch
from torch import nn


def recomputing() -> bool:
    """Whether this forward runs inside the autograd engine's backward pass: activation
    checkpointing's recomputation (reentrant or not), a replay of a forward that already ran.
    The engine's graph-task id (-1 outside backward) is what ``torch.utils.checkpoint`` itself
    reads to tell its recomputations apart."""
    return torch._C._current_graph_task_id() != -1


def apply_pending_updates(model: nn.Module) -> None:
    """Apply the statistics every submodule with an ``apply_pending_updates()`` recorded since
    its last update (a no-op for the others)."""
    for module in model.modules():
        update = getattr(module, "apply_pending_updates", None)
        if callable(update):
            update()


def prepare_training_step(model: nn.Module) -> None:
    """Apply what every submodule with a ``before_training_step()`` has due before the next
    training forward (idempotent: each micro-batch of an accumulated step may call it)."""
    for module in model.modules():
        prepare = getattr(module, "before_training_step", None)
        if callable(prepare):
            prepare()
