"""A key/value cache for incremental decoding: each attention application's keys and values of
the positions decoded so far, so a new token costs one query against the cached keys instead
of a forward pass over the whole window.

How.  :meth:`TransformerLM.decode <xformer_bench.models.transformer_lm.TransformerLM.decode>`
calls :meth:`KVCache.begin_step`, then runs the stack with ``ctx.cache`` set; every
:class:`~xformer_bench.models.attention_layer.MultiHeadAttention` application, in the order the
stack applies them, appends its new keys and values -- rotated at their absolute positions,
before the key/value heads are shared, so multi-query attention caches one head -- and attends
over all of them (S = past + T keys, the queries the last T: the house's convention).  The
entries are counted per *application*, not per parameter layer, so a shared block
(``model.share_blocks``) applied n times keeps n entries.

Which models can use it (:func:`cache_blocker`): ``stack=standard`` with plain
``MultiHeadAttention`` token mixers whose kernel takes more keys than queries
(``longer_keys``) causally, with a position scheme that can rotate at an offset.  Everything
else -- other stacks (Transformer-XL memory, adaptive depth, funnels), token mixers without
cacheable keys (LSH, FNet, MLP-Mixer, RealFormer's logits), kernels that see only the
segment -- decodes uncached: the caller recomputes the window (:mod:`xformer_bench.sample`).

Simplification: entries grow by concatenation (one copy per step, O(S) like the attention
itself), not into a preallocated buffer.
"""

from __future__ import annotations

import torch
from torch import nn

CACHE_KERNEL_NEEDS = frozenset({"causal", "longer_keys"})
UNCACHEABLE_KERNELS = frozenset({"AxialAttention"})
"""Kernels that declare ``longer_keys`` and causality yet lay their pattern out over the
queries they are given (axial attention's grid of the T queries): one query at a time is not
the forward pass's pattern, so they decode uncached.  Every other kernel the cache admits lays
its pattern out by absolute position (the queries are the last T of S keys) and decodes as the
forward pass scores: ``tests/test_cached_decode.py`` checks each, one token a step and after a
multi-token prompt, at settings whose windows, blocks and clusters the sequence crosses."""


class KVCache:
    """Keys and values per attention application: (B, H_kv, S, Dh) each, S the positions
    decoded so far."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.start = 0
        """Positions cached before the current step: the new tokens sit at ``start ..``."""
        self._next = 0  # the application the next ``extend`` belongs to

    @property
    def length(self) -> int:
        """Positions cached (after the current step's first application, including its)."""
        return self.keys[0].shape[2] if self.keys else 0

    def begin_step(self) -> None:
        """Before a forward pass over new tokens: applications count from the first again."""
        self.start, self._next = self.length, 0

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append this application's new keys and values (B, H_kv, T, Dh); return all of them,
        (B, H_kv, start + T, Dh) each."""
        i, self._next = self._next, self._next + 1
        if i == len(self.keys):
            if self.start:
                raise RuntimeError(f"the cache holds {self.start} positions but no entry for "
                                   f"attention application {i}: a different model filled it")
            self.keys.append(k)
            self.values.append(v)
        else:
            self.keys[i] = torch.cat([self.keys[i], k], dim=2)
            self.values[i] = torch.cat([self.values[i], v], dim=2)
        if self.keys[i].shape[2] != self.start + k.shape[2]:
            raise RuntimeError(f"attention application {i} cached {self.keys[i].shape[2]} "
                               f"positions, expected {self.start + k.shape[2]}")
        return self.keys[i], self.values[i]


def cache_blocker(model: nn.Module) -> str | None:
    """Why ``model`` (a TransformerLM) cannot decode with a :class:`KVCache`, in words naming
    the option; None when it can."""
    from xformer_bench.models.attention_layer import MultiHeadAttention
    from xformer_bench.stacks.standard import StandardStack

    if type(model.stack) is not StandardStack:
        return f"{type(model.stack).__name__} applies its blocks otherwise (stack=standard caches)"
    if not model.position.decodes_with_cache():
        return f"position {type(model.position).__name__} cannot rotate at an offset"
    for block in model.stack.blocks:
        mixer = block.attention
        if type(mixer) is not MultiHeadAttention:
            return f"token mixer {type(mixer).__name__} has no cacheable keys"
        kernel = type(mixer.kernel).__name__
        if not CACHE_KERNEL_NEEDS <= mixer.kernel.provides or kernel in UNCACHEABLE_KERNELS:
            return f"attention kernel {kernel} does not attend causally over cached keys"
    return None
