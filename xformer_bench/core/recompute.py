"""Whether the block being run is already recomputed in the backward pass as a whole
(``model.checkpointing``; :func:`xformer_bench.stacks.apply_block`), so that a part which
would checkpoint itself (:mod:`xformer_bench.attention._ops.recompute`) does not do it again
inside it: one recomputation, not two.  Neither side reads or sets the flag under
``torch.compile`` (TorchDynamo cannot trace a ``ContextVar``; nothing is checkpointed there)."""

from __future__ import annotations

from contextvars import ContextVar, Token

_BLOCK_RECOMPUTED: ContextVar[bool] = ContextVar("block_recomputed", default=False)


def block_recomputed() -> bool:
    return _BLOCK_RECOMPUTED.get()


def enter_recomputed_block() -> Token[bool]:
    """Marks what runs next as part of a block checkpointed whole, until :func:`leave`."""
    return _BLOCK_RECOMPUTED.set(True)


def leave(token: Token[bool]) -> None:
    _BLOCK_RECOMPUTED.reset(token)
