"""Conventions of target tensors that datasets produce and tasks read.

Lives below both ``data/`` and ``tasks/`` so that a task never imports a dataset module.
"""

import torch

IGNORE_INDEX = -100
"""A target equal to this is padding: not predicted, not counted (``F.cross_entropy``'s
default ``ignore_index``)."""


def scored_columns(targets: torch.Tensor, per_example: int) -> torch.Tensor:
    """(B, T) targets -> (B, per_example) column indices: each row's scored targets (those other
    than :data:`IGNORE_INDEX`) first, in order, then ignored ones to fill -- a stable sort of the
    flags, so no data-dependent shape and no host synchronisation.  Exact for data that scores
    at most ``per_example`` targets a row (MQAR: one per queried key); the task then runs the
    output head on these columns only (a V-way softmax at n of T positions)."""
    ignored = (targets == IGNORE_INDEX).to(torch.uint8)
    return torch.sort(ignored, dim=1, stable=True).indices[:, :per_example]
