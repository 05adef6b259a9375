"""Conventions of target tensors that datasets produce and tasks read.

Lives below both ``data/`` and ``tasks/`` so that a task never imports a dataset module.
"""

IGNORE_INDEX = -100
"""A target equal to this is padding: not predicted, not counted (``F.cross_entropy``'s
default ``ignore_index``)."""
