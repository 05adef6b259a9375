"""Position schemes.  Builders take ``dims`` plus the keys of their YAML and return a
:class:`Position`, which can act at three places; each scheme overrides what it uses:

* ``embed``  -- added to the token embeddings (sinusoidal, learned);
* ``bias``   -- an additive attention bias, added to the scaled logits ``q k^T / sqrt(Dh)``
  (relative, t5, alibi); it may depend on the queries (Shaw et al.'s relative keys) and, for a
  scheme that says so in ``reads_keys``, on the keys (Transformer-XL's ``u . k_j``).  It is
  *lazy*: a :class:`PairBias`, a function of (query, key) index pairs that a kernel evaluates
  on the pairs it computes (``bias.at(i, j)``), or densely when it computes all of them
  (``bias.dense()``) -- so a sparse kernel never needs a T x T tensor;
* ``rotate`` -- a transform of queries and keys (rotary).

Cached decoding (:mod:`xformer_bench.core.decode_cache`) runs the model on new tokens that
continue ``start`` cached positions: ``embed(x, start=)`` places them at absolute positions
``start ..``, ``rotate_from(q, k, start)`` rotates this step's queries and keys there (the keys
are cached rotated), and a bias is evaluated over the new queries and all ``start + T`` keys
as usual.  ``max_positions`` is how far an absolute scheme reaches (None: no limit).

What a scheme needs of the attention is declared in ``requires`` (see
:mod:`xformer_bench.models.capabilities`): a bias needs a kernel that adds one, a rotation
needs queries and keys.

Relative schemes share one convention: queries are the *last* ``t_query`` of the
``t_key`` key positions (the alignment of the causal mask in the attention kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn


class PairBias:
    """An additive attention bias as a function of index pairs.

    ``at(query_index, key_index)`` takes two long tensors that broadcast to a common shape S
    (indices into the ``t_query`` queries and ``t_key`` keys) and returns the bias of those
    pairs, heads first: (H, *S), or (B, H, *S) when it depends on the queries' content.
    """

    def __init__(self, t_query: int, t_key: int, device: torch.device,
                 at: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.t_query, self.t_key, self.device = t_query, t_key, device
        self.at = at

    @classmethod
    def of_tensor(cls, bias: torch.Tensor) -> PairBias:
        """The lazy form of a dense (H, Tq, Tk) or (B, H, Tq, Tk) bias."""
        def at(query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:
            query_index, key_index = torch.broadcast_tensors(query_index, key_index)
            return bias[..., query_index, key_index]

        return cls(bias.shape[-2], bias.shape[-1], bias.device, at)

    def distance(self, query_index: torch.Tensor, key_index: torch.Tensor) -> torch.Tensor:
        """``j - i`` in positions (queries are the last ``t_query`` of the keys): shape S."""
        return key_index - (query_index + self.t_key - self.t_query)

    def dense(self) -> torch.Tensor:
        """Every pair: (H, Tq, Tk) or (B, H, Tq, Tk)."""
        query_index = torch.arange(self.t_query, device=self.device)[:, None]  # (Tq, 1)
        key_index = torch.arange(self.t_key, device=self.device)[None, :]  # (1, Tk)
        return self.at(query_index, key_index)


class Position(nn.Module):
    requires: Mapping[str, frozenset[str]] = {}
    """Capabilities this scheme needs of other parts, by group (``{"attention": {...}}``)."""
    reads_keys: bool = False
    """Whether ``bias`` reads the keys' content (``key=``): attention layers pass the keys only
    to such schemes, so the schemes that ignore them need not take the argument."""

    max_positions: int | None = None
    """The most positions ``embed`` can place (a learned table's rows); None: unbounded."""

    def embed(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:  # (B, T, D) -> (B, T, D)
        """``x`` with its rows at positions ``start .. start + T - 1`` encoded (here: unchanged)."""
        return x

    def bias(
        self,
        t_query: int,
        t_key: int,
        layer: int = 0,
        query: torch.Tensor | None = None,  # (B, H, Tq, Dh), for content-dependent biases
        key: torch.Tensor | None = None,  # (B, H, Tk, Dh), passed only if ``reads_keys``
    ) -> PairBias | None:
        """Additive attention bias of layer ``layer`` over ``t_query`` queries and ``t_key``
        keys, or None."""
        return None

    def rotate(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k  # (B, H, T, Dh) each

    def rotate_from(self, q: torch.Tensor, k: torch.Tensor,
                    start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``rotate`` for cached decoding: queries (B, H, T, Dh) and this step's keys
        (B, H_kv, T, Dh) both at positions ``start .. start + T - 1``.  A scheme that rotates
        overrides it; the ones that do not rotate return both unchanged."""
        if type(self).rotate is not Position.rotate:
            raise NotImplementedError(f"{type(self).__name__} rotates but has no rotate_from: "
                                      "decode without a cache")
        return q, k

    def decodes_with_cache(self) -> bool:
        """Whether :meth:`rotate_from` is right for this scheme (it rotates nothing, or says
        how to rotate at an offset)."""
        return type(self).rotate is Position.rotate or \
            type(self).rotate_from is not Position.rotate_from


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
