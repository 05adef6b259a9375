"""What incremental decoding keeps between steps: one slot per token-mixer application.

:meth:`TransformerLM.decode <xformer_bench.models.transformer_lm.TransformerLM.decode>` calls
:meth:`DecodeCache.begin_step` with the number of new tokens, then runs the stack with
``ctx.cache`` set.  Every mixer application, in the order the stack applies them, takes the
next slot and keeps there what its declared ``decode_state`` says (:data:`DECODE_STATES`):

* ``keys_values`` -- :class:`~xformer_bench.attention.multi_head.MultiHeadAttention` appends
  its new keys and values (:meth:`DecodeCache.extend`; rotated at their absolute positions,
  before the key/value heads are shared, so multi-query attention caches one head) and attends
  over all of them: O(S) memory and time per token;
* ``recurrent`` -- a recurrent mixer (a state-space or linear-recurrent layer) reads its state
  from ``slot["state"]`` (absent at the first step), runs the new tokens from it and writes the
  state after them: O(1) memory and time per token;
* ``history`` -- a mixer whose output at a position depends on every earlier input through a
  filter as long as the sequence (a long convolution) keeps its inputs in ``slot["history"]``:
  O(S) memory and time per token, like keys and values.

Slots are counted per *application*, not per parameter layer, so a shared block
(``model.share_blocks``) applied n times keeps n.  Simplification: keys and values grow by
concatenation (one copy per step, O(S) like the attention itself), not into a preallocated
buffer.
"""

from __future__ import annotations

from typing import Any

import torch

DECODE_STATES = {
    "keys_values": "the keys and values of every position decoded so far",
    "recurrent": "a fixed-size recurrent state",
    "history": "the mixer's own inputs of every position decoded so far (a long convolution)",
    "none": "nothing: the window is recomputed every step",
}
"""What a token mixer may declare it keeps between decoding steps (``TokenMixer.decode_state``)."""

SHARED_BY_ROWS = frozenset({"taps"})
"""Slot entries that every batch row shares (hyena's filter taps, (D, S)); every other tensor
a slot holds has the batch first."""


class DecodeCache:
    """Per mixer application, a dict kept from one decoding step to the next."""

    def __init__(self) -> None:
        self.slots: list[dict[str, Any]] = []
        self.length = 0
        """Positions decoded so far, the current step's included once it has begun."""
        self.start = 0
        """Positions decoded before the current step: the new tokens sit at ``start ..``."""
        self._next = 0  # the application the next ``slot`` belongs to

    def begin_step(self, new_tokens: int) -> None:
        """Before a forward pass over ``new_tokens`` positions: slots count from the first."""
        self.start, self.length, self._next = self.length, self.length + new_tokens, 0

    def slot(self) -> dict[str, Any]:
        """The next application's slot (created at the first step, empty)."""
        i, self._next = self._next, self._next + 1
        if i == len(self.slots):
            if self.start:
                raise RuntimeError(f"the cache holds {self.start} positions but no slot for "
                                   f"mixer application {i}: a different model filled it")
            self.slots.append({})
        return self.slots[i]

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the next application's new keys and values (B, H_kv, T, Dh); return all of
        them, (B, H_kv, start + T, Dh) each."""
        slot = self.slot()
        if "keys" in slot:
            k, v = torch.cat([slot["keys"], k], dim=2), torch.cat([slot["values"], v], dim=2)
        slot["keys"], slot["values"] = k, v
        if k.shape[2] != self.length:
            raise RuntimeError(f"a mixer application cached {k.shape[2]} positions, expected "
                               f"{self.length}")
        return k, v

    def reorder(self, rows: torch.Tensor) -> None:
        """Keep, in this order, the batch rows ``rows`` (N,) of every slot: a beam search's
        hypotheses after a step, each continuing the row it came from."""
        self.slots = [{key: value if key in SHARED_BY_ROWS else _take_rows(value, rows)
                       for key, value in slot.items()} for slot in self.slots]


def _take_rows(value: Any, rows: torch.Tensor) -> Any:
    """``value``'s batch rows ``rows``: a tensor's first dimension, or each tensor of a tuple,
    list or dict of them."""
    if isinstance(value, torch.Tensor):
        return value.index_select(0, rows.to(value.device))
    if isinstance(value, (tuple, list)):
        return type(value)(_take_rows(v, rows) for v in value)
    if isinstance(value, dict):
        return {k: _take_rows(v, rows) for k, v in value.items()}
    return value
