"""Whether the block being run is already recomputed in the backward pass as a whole
(``model.checkpointing``; :func:`xformer_bench.stacks.apply_block`), so that a part which
would checkpoint itself (:mod:`xformer_bench.attention._ops.recompute`) does not do it again
inside it: one recomputation, not two."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_BLOCK_RECOMPUTED: ContextVar[bool] = ContextVar("block_recomputed", default=False)


def block_recomputed() -> bool:
    return _BLOCK_RECOMPUTED.get()


@contextmanager
def recomputed_block(active: bool = True) -> Iterator[None]:
    """Marks what runs inside as part of a block checkpointed whole (when ``active``)."""
    token = _BLOCK_RECOMPUTED.set(True) if active else None
    try:
        yield
    finally:
        if token is not None:
            _BLOCK_RECOMPUTED.reset(token)
