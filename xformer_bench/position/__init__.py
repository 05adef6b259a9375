"""Position schemes.  Builders take ``dims`` plus the keys of their YAML and return a
:class:`Position`, which can act at three places; each scheme overrides what it uses:

* ``embed``  -- added to the token embeddings (sinusoidal, learned);
* ``bias``   -- an additive attention bias (relative / bucketed / ALiBi schemes);
* ``rotate`` -- a transform of queries and keys (rotary).
"""

from __future__ import annotations

import torch
from torch import nn


class Position(nn.Module):
    def embed(self, x: torch.Tensor) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        return x

    def bias(self, t_query: int, t_key: int, layer: int = 0) -> torch.Tensor | None:
        """Additive attention bias (H, Tq, Tk) for layer ``layer``, or None."""
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k  # (B, H, T, Dh) each
