"""Which token mixer each block of a stack gets: the ``attention`` option, or at the depths
``model.hybrid`` declares (:mod:`xformer_bench.hybrid_layout`) the other one -- a hybrid
stack (Samba, Ren et al. 2024; Griffin, De et al. 2024; Jamba, Lieber et al. 2024).

Stacks build their blocks through ``make_block()``, one per layer in depth order (every stack
of :mod:`xformer_bench.stacks` does), so the n-th call builds layer n.  A stack that builds
another number of blocks, or shares one across depth (``model.share_blocks``,
``stack=universal``), cannot place a mixer at a depth: one ``ConfigError`` line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from xformer_bench.errors import ConfigError
from xformer_bench.hybrid_layout import hybrid_layout


class LayerMixers:
    """The ``attention`` spec of each block in the order a stack builds them
    (:meth:`next_spec`), then the check that the stack built one block per layer
    (:meth:`check_stack`)."""

    def __init__(self, attention: Mapping[str, Any], hybrid: Any, n_layers: int,
                 share_blocks: bool = False):
        self.attention, self.n_layers = attention, n_layers
        self.layout = hybrid_layout(hybrid, n_layers)
        if self.layout is not None and share_blocks:
            self._refuse_sharing("model.share_blocks=true")
        self.built = 0

    @property
    def layers(self) -> tuple[int, ...]:
        """The depths with the other mixer (none without a hybrid)."""
        return () if self.layout is None else self.layout.layers

    def kinds(self) -> list[tuple[int, Mapping[str, Any], str]]:
        """A layer of each kind of mixer, its option node, and the prefix an error names the
        option with (``model.hybrid.`` for the other mixer): the layers to check."""
        base = next(i for i in range(self.n_layers) if i not in self.layers)
        other = [(self.layers[0], self.layout.attention, "model.hybrid.")] if self.layers else []
        return [(base, self.attention, ""), *other]

    def next_spec(self) -> Mapping[str, Any]:
        """The option node of the next block built: layer ``self.built``."""
        layer, self.built = self.built, self.built + 1
        return self.layout.attention if layer in self.layers else self.attention

    def _refuse_sharing(self, shared_by: str) -> None:
        raise ConfigError(f"model.hybrid places attention={self.layout.attention['name']} at "
                          f"layers {list(self.layout.layers)}, and {shared_by} shares one block "
                          "across depth: drop one of them")

    def check_stack(self, stack: Any, stack_name: str) -> None:
        """One ConfigError line when ``stack`` did not build one block per layer."""
        if self.layout is None:
            return
        if getattr(stack, "shares_blocks", False):
            self._refuse_sharing(f"stack={stack_name}")
        if self.built != self.n_layers or len(stack.blocks) != self.n_layers:
            raise ConfigError(f"stack={stack_name} builds {len(stack.blocks)} blocks for "
                              f"model.n_layers={self.n_layers}; model.hybrid needs one block "
                              "per layer: choose another stack or drop model.hybrid")
