"""Position schemes.  Builders take ``dims`` plus the keys of their YAML and return a
:class:`Position`, which can act at three places; each scheme overrides what it uses:

* ``embed``  -- added to the token embeddings (sinusoidal, learned);
* ``bias``   -- an additive attention bias, added to the scaled logits ``q k^T / sqrt(Dh)``
  (relative, t5, alibi); it may depend on the queries (Shaw et al.'s relative keys);
* ``rotate`` -- a transform of queries and keys (rotary).

Relative schemes share one convention: queries are the *last* ``t_query`` of the
``t_key`` key positions (the alignment of the causal mask in the attention kernels).
"""

from __future__ import annotations

import torch
from torch import nn


class Position(nn.Module):
    def embed(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        return x

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,  # (B, H, Tq, Dh), for content-dependent biases
    ) -> torch.Tensor | None:
        """Additive attention bias for layer ``layer``: (H, Tq, Tk), (B, H, Tq, Tk) when it
        depends on ``query``, or None."""
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k  # (B, H, T, Dh) each


def relative_distance(t_query: int, t_key: int, device: torch.device | None = None) -> torch.Tensor:
    """``j - i`` for query position ``i`` and key position ``j``: (Tq, Tk), long.

    Queries sit at key positions ``t_key - t_query .. t_key - 1``; past keys give ``j - i < 0``.
    """
    query_positions = torch.arange(t_key - t_query, t_key, device=device)  # (Tq,)
    key_positions = torch.arange(t_key, device=device)  # (Tk,)
    return key_positions[None, :] - query_positions[:, None]  # (Tq, Tk)


class LayerwiseTable(nn.Module):
    """A learned table per layer, or one table that every layer shares.

    ``table(layer)`` returns the table of shape ``shape`` that layer ``layer`` uses.
    """

    def __init__(self, n_layers: int, shared: bool, shape: tuple[int, ...], init_std: float):
        super().__init__()
        self.shared = shared
        n_tables = 1 if shared else n_layers
        self.weight = nn.Parameter(torch.randn(n_tables, *shape) * init_std)  # (L or 1, *shape)

    def forward(self, layer: int) -> torch.Tensor:
        return self.weight[0 if self.shared else layer]
