"""Frequency clusters of a vocabulary, shared by adaptive input (Baevski & Auli 2019) and the
adaptive softmax (Grave et al. 2017): cluster i holds the ids [edges[i], edges[i + 1]) and has
width D / factor^i.

Both papers sort the vocabulary by frequency, so that cluster 0 holds the most frequent words.
xbench's cutoffs are fractions of the vocabulary's ids, taken in id order (a deviation):
byte-level text puts ASCII (the frequent bytes of English text) below 128 and UTF-8's
multi-byte sequences above it, and a BPE vocabulary's ids follow its merges, roughly by
frequency; a vocabulary sorted by the training split's counts is not built."""

from __future__ import annotations

from xformer_bench.errors import ConfigError


def cluster_edges(vocab_size: int, cutoffs: list[float], key: str) -> list[int]:
    """``[0, c_1, ..., V]``: the ids where each cluster starts, then V; ``cutoffs`` are
    increasing fractions of the vocabulary in (0, 1), each cluster non-empty."""
    edges = [0, *(round(c * vocab_size) for c in cutoffs), vocab_size]
    if not cutoffs or any(b <= a for a, b in zip(edges, edges[1:])):
        raise ConfigError(f"{key}.cutoffs={list(cutoffs)} must be increasing fractions of the "
                          f"vocabulary in (0, 1), each cluster non-empty (V={vocab_size})")
    return edges


def cluster_widths(d_model: int, n_clusters: int, factor: int, key: str) -> list[int]:
    """``D / factor^i`` for cluster i (each at least 1 wide)."""
    if factor < 1:
        raise ConfigError(f"{key}.factor={factor} must be a positive integer")
    return [max(1, d_model // factor ** i) for i in range(n_clusters)]
