"""Byte n-gram count tables for :mod:`ngram_floors`: raw counts ``c(h w)`` and Kneser-Ney
continuation counts ``N1+(. h w)`` (Chen & Goodman 1998, sec. 2.7), built and looked up with
numpy only (``np.unique`` to count, ``np.searchsorted`` to look up; no loop over bytes).

An n-gram ``b_1 .. b_n`` is the int64 ``sum_k b_k 256^(n-k)`` (oldest byte most significant;
``256^5 = 2^40`` fits), so its context ``h = b_1 .. b_{n-1}`` is ``key >> 8``, its last byte
``key & 255``, and keys sorted by value are sorted by context first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

VOCABULARY = 256


def as_bytes(data: bytes | bytearray | np.ndarray) -> np.ndarray:
    """``data`` as a 1-D uint8 array (a view where possible)."""
    if isinstance(data, (bytes, bytearray)):
        return np.frombuffer(bytes(data), dtype=np.uint8)
    array = np.asarray(data)
    if array.ndim != 1 or array.dtype != np.uint8:
        raise ValueError(f"expected 1-D uint8 bytes, got shape {array.shape} {array.dtype}")
    return array


def ngram_keys(data: np.ndarray, n: int) -> np.ndarray:
    """``keys[i]`` = the n-gram ending at ``data[i]``, for ``i = n-1 .. len(data)-1``."""
    data = data.astype(np.int64)
    keys = data[n - 1:].copy()
    for back in range(1, n):
        keys |= data[n - 1 - back:len(data) - back] << (8 * back)
    return keys


@dataclass(frozen=True)
class CountTable:
    """One order's counts: ``ngrams`` (sorted keys) with ``counts`` > 0, and per context
    ``h`` (sorted ``contexts``) the ``totals`` ``sum_w c(h w)`` and the ``types``
    ``N1+(h .)`` = how many ``w`` have ``c(h w) > 0``."""
    order: int
    ngrams: np.ndarray
    counts: np.ndarray
    contexts: np.ndarray
    totals: np.ndarray
    types: np.ndarray

    @classmethod
    def from_counts(cls, order: int, ngrams: np.ndarray, counts: np.ndarray) -> "CountTable":
        """From sorted unique keys and their positive counts."""
        context_of = ngrams >> 8
        starts = np.flatnonzero(np.r_[True, context_of[1:] != context_of[:-1]])
        return cls(order, ngrams, counts, context_of[starts],
                   np.add.reduceat(counts, starts), np.diff(np.r_[starts, len(ngrams)]))

    def count_of_counts(self, k: int) -> int:
        """How many n-grams have count exactly ``k`` (``n_k`` of Ney et al. 1994)."""
        return int(np.count_nonzero(self.counts == k))

    def lookup(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(c(h w), c(h), N1+(h .))`` for each n-gram key; zeros where never seen."""
        return (_find(self.ngrams, self.counts, keys),
                _find(self.contexts, self.totals, keys >> 8),
                _find(self.contexts, self.types, keys >> 8))


def _find(sorted_keys: np.ndarray, values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """``values`` at ``keys`` in ``sorted_keys``; 0 where a key is absent."""
    if len(sorted_keys) == 0:
        return np.zeros(len(keys), dtype=np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == keys, values[at], 0)


def raw_table(data: np.ndarray, n: int) -> CountTable:
    """``c(h w)``: how often each n-gram occurs in ``data``."""
    ngrams, counts = np.unique(ngram_keys(data, n), return_counts=True)
    return CountTable.from_counts(n, ngrams, counts.astype(np.int64))


def continuation_table(longer: CountTable) -> CountTable:
    """``N1+(. h w)``: how many distinct bytes precede each n-gram ``h w``, from the raw table
    of order n+1 (an n-gram only at the very start of the data has none and is left out)."""
    n = longer.order - 1
    ngrams, counts = np.unique(longer.ngrams & ((1 << (8 * n)) - 1), return_counts=True)
    return CountTable.from_counts(n, ngrams, counts.astype(np.int64))


def count_tables(data: np.ndarray, max_order: int) -> tuple[dict[int, CountTable],
                                                             dict[int, CountTable]]:
    """``(raw, continuation)``: raw tables for orders ``1..max_order``, continuation tables
    for orders ``1..max_order-1`` (each from the raw table one order up)."""
    raw = {n: raw_table(data, n) for n in range(1, max_order + 1)}
    return raw, {n: continuation_table(raw[n + 1]) for n in range(1, max_order)}
