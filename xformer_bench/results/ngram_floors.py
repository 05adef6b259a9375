"""The n-gram floors: bits per byte of interpolated Kneser-Ney byte n-gram models (orders 1-5),
the entropy a model with the same context should at least reach.

Interpolated Kneser-Ney with one absolute discount ``D_n`` per order (Chen & Goodman 1998,
"An Empirical Study of Smoothing Techniques for Language Modeling", eq. 17 with sec. 2.7's
lower-order counts), over the 256 byte values::

    P_n(w|h) = max(c_n(h w) - D_n, 0) / c_n(h)  +  D_n N1+(h .) / c_n(h) * P_{n-1}(w|h')

``h'`` is ``h`` without its oldest byte.  The order-N model counts raw ``c_N(h w)`` at its top
order and continuation counts ``c_n(h w) = N1+(. h w)`` (distinct bytes before ``h w``) below;
``c_n(h) = sum_w c_n(h w)``, ``N1+(h .)`` = how many ``w`` have ``c_n(h w) > 0``.  A context never
seen (``c_n(h) = 0``) passes ``P_{n-1}(w|h')`` through.  The order-1 base ``P_0`` is uniform,
``1/256``, so order 1 is the unigram (raw counts for the order-1 model, continuation counts
inside higher models) interpolated with the uniform distribution and every byte gets mass.

Deviations and choices, named:

* Discounts: per model and order, coordinate-wise golden-section search over ``[0.001, 0.999]``
  (tolerance 1e-3, two sweeps, top order first) minimising the validation bits per byte,
  starting from Ney et al.'s (1994) ``D = n1 / (n1 + 2 n2)`` of each table (also the value
  used when there is no validation data).  Not modified KN (one ``D`` per order, not three).
* Windows: the scored bytes are cut into windows of ``window`` bytes (as a model with
  ``seq_len = window`` sees them); the byte at offset ``j`` of a window sees only its ``j``
  predecessors, so the order-N floor scores it with the order-``min(N, j + 1)`` model (raw
  counts at that model's top order, its own discounts).  Training counts run over the
  training bytes unbroken; discounts are tuned on validation bytes with their full context.
* Speed (measured, one core, numpy): 1 MB train + 50 KB validation + 50 KB test, orders 1-5,
  1.6 s (counting 0.2 s; the discount search most of the rest); 5 MB train 2.1 s.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from xformer_bench.results.ngram_counts import (VOCABULARY, CountTable, as_bytes, count_tables,
                                                ngram_keys)

ORDERS = (1, 2, 3, 4, 5)
DISCOUNT_RANGE = (1e-3, 1 - 1e-3)
CACHE_VERSION = 1

Stats = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Per scored byte: ``(c_n(h w), c_n(h), N1+(h .))``, all zero where order n passes through."""


def interpolate(levels: Sequence[Stats], discounts: Sequence[float]) -> np.ndarray:
    """``P_N(w|h)`` for each scored byte from its per-order statistics, orders ``1..N``."""
    probs = np.full(len(levels[0][0]), 1.0 / VOCABULARY)
    for (count, total, types), discount in zip(levels, discounts):
        seen = total > 0
        mixed = (np.maximum(count - discount, 0.0) + discount * types * probs) \
            / np.maximum(total, 1)
        probs = np.where(seen, mixed, probs)
    return probs


def bits_per_byte(levels: Sequence[Stats], discounts: Sequence[float]) -> float:
    """Mean ``-log2 P`` of the scored bytes."""
    return float(-np.mean(np.log2(interpolate(levels, discounts))))


def context_stats(table: CountTable, data: np.ndarray) -> Stats:
    """``table``'s statistics for every byte of ``data`` with its full history in ``data``
    (the first ``n-1`` bytes, short of history, pass order n through)."""
    keys = np.zeros(len(data), dtype=np.int64)
    keys[table.order - 1:] = ngram_keys(data, table.order)
    count, total, types = table.lookup(keys)
    short = np.arange(len(data)) < table.order - 1
    return tuple(np.where(short, 0, s) for s in (count, total, types))


def windowed(log2_probs: Sequence[np.ndarray], window: int) -> np.ndarray:
    """Per byte, ``log2_probs[k]`` (the order-(k+1) model's) for ``k = min(N-1, j)``, ``j``
    its offset in its window of ``window`` bytes: each byte sees only its window."""
    offsets = np.arange(len(log2_probs[0])) % window
    return np.choose(np.minimum(offsets, len(log2_probs) - 1), log2_probs)


@dataclass(frozen=True)
class KneserNey:
    """An order-N model: ``tables[n-1]`` counts order n (continuation below N, raw at N)."""
    tables: tuple[CountTable, ...]
    discounts: tuple[float, ...]

    @classmethod
    def fit(cls, train, order: int, discounts: Sequence[float] | None = None) -> "KneserNey":
        """Counts from ``train``; ``discounts`` (orders 1..N) default to Ney's estimate."""
        raw, continuation = count_tables(as_bytes(train), order)
        tables = (*(continuation[n] for n in range(1, order)), raw[order])
        return cls(tables, tuple(discounts) if discounts is not None
                   else tuple(ney_discount(t) for t in tables))

    def log2_probs(self, data) -> np.ndarray:
        """``log2 P(byte | its history in data)`` for each byte of ``data``."""
        data = as_bytes(data)
        return np.log2(interpolate([context_stats(t, data) for t in self.tables],
                                   self.discounts))

    def distribution(self, history: bytes) -> np.ndarray:
        """``P(w | history)`` for the 256 bytes ``w``; the history's last N-1 bytes count."""
        levels = []
        for table in self.tables:
            n = table.order
            if len(history) < n - 1:
                levels.append(tuple(np.zeros(VOCABULARY, dtype=np.int64) for _ in range(3)))
                continue
            context = int.from_bytes(history[len(history) - n + 1:], "big") if n > 1 else 0
            levels.append(table.lookup((context << 8) | np.arange(VOCABULARY, dtype=np.int64)))
        return interpolate(levels, self.discounts)


def ney_discount(table: CountTable) -> float:
    """Ney et al. (1994): ``D = n1 / (n1 + 2 n2)``, clipped to the search range."""
    n1, n2 = table.count_of_counts(1), table.count_of_counts(2)
    estimate = n1 / (n1 + 2 * n2) if n1 + n2 > 0 else 0.5
    return min(max(estimate, DISCOUNT_RANGE[0]), DISCOUNT_RANGE[1])


def golden_section(loss, low: float, high: float, tolerance: float = 1e-3) -> float:
    """The minimiser of a unimodal ``loss`` on ``[low, high]`` (Kiefer 1953)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    loss_c, loss_d = loss(c), loss(d)
    while b - a > tolerance:
        if loss_c < loss_d:
            b, d, loss_d = d, c, loss_c
            c = b - ratio * (b - a)
            loss_c = loss(c)
        else:
            a, c, loss_c = c, d, loss_d
            d = a + ratio * (b - a)
            loss_d = loss(d)
    return (a + b) / 2


def tune_discounts(levels: Sequence[Stats], start: Sequence[float],
                   sweeps: int = 2) -> tuple[float, ...]:
    """Coordinate-wise golden-section search of the discounts on validation statistics."""
    discounts = list(start)
    if len(levels[0][0]) == 0:
        return tuple(discounts)
    for _ in range(sweeps):
        for n in reversed(range(len(discounts))):
            def loss(value: float, n: int = n) -> float:
                return bits_per_byte(levels, [*discounts[:n], value, *discounts[n + 1:]])
            discounts[n] = golden_section(loss, *DISCOUNT_RANGE)
    return tuple(discounts)


def entropies(train, val, test, window: int, orders: Sequence[int] = ORDERS
              ) -> tuple[dict[int, float], dict[int, tuple[float, ...]]]:
    """``({order: test bits per byte in windows}, {order: tuned discounts, orders 1..N})``."""
    train, val, test = as_bytes(train), as_bytes(val), as_bytes(test)
    if window < 1 or len(test) == 0:
        raise ValueError(f"need window >= 1 and test bytes (window={window}, {len(test)} bytes)")
    top = max(orders)
    raw, continuation = count_tables(train, top)
    val_stats = {(kind, n): context_stats(t, val)
                 for kind, tables in (("raw", raw), ("continuation", continuation))
                 for n, t in tables.items()}
    discounts, log2_probs = {}, []
    for order in range(1, top + 1):
        keys = [*(("continuation", n) for n in range(1, order)), ("raw", order)]
        tables = [*(continuation[n] for n in range(1, order)), raw[order]]
        full_context = [tuple(s[order - 1:] for s in val_stats[key]) for key in keys]
        discounts[order] = tune_discounts(full_context, [ney_discount(t) for t in tables])
        log2_probs.append(KneserNey(tuple(tables), discounts[order]).log2_probs(test))
    bits = {order: float(-np.mean(windowed(log2_probs[:order], window))) for order in orders}
    return bits, {order: discounts[order] for order in orders}


def cache_key(train, val, test, window: int, orders: Sequence[int]) -> str:
    """sha1 of the three byte arrays (length-prefixed), the window, the orders and version."""
    digest = hashlib.sha1(f"v{CACHE_VERSION} window={window} orders={list(orders)}".encode())
    for data in (train, val, test):
        data = as_bytes(data)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data.tobytes())
    return digest.hexdigest()


def floors(train, val, test, window: int, cache_dir: Path | str,
           orders: Sequence[int] = ORDERS) -> dict[int, float]:
    """``{order: bits per byte}`` on ``test``, cached in ``cache_dir/ngram_floors_<sha1>.json``."""
    path = Path(cache_dir) / f"ngram_floors_{cache_key(train, val, test, window, orders)}.json"
    if path.is_file():
        return {int(order): bits for order, bits in
                json.loads(path.read_text())["bits_per_byte"].items()}
    bits, discounts = entropies(train, val, test, window, orders)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({
        "window": window, "bytes": [len(as_bytes(d)) for d in (train, val, test)],
        "bits_per_byte": bits, "discounts": discounts}, indent=1))
    temporary.replace(path)
    return bits


FLOOR_ORDERS_SHOWN = (2, 3, 4, 5)


def run_floors(splits, window: int, cache_dir: Path | str) -> dict:
    """What a run's record keeps (``ngram_floors``): the floors of its corpus's test split at
    its window (``splits``: ``{"train", "val", "test"}`` byte arrays)."""
    bits = floors(splits["train"], splits["val"], splits["test"], window, cache_dir)
    return {"split": "test", "window": window, "method": "interpolated Kneser-Ney",
            "bits_per_byte": {str(order): value for order, value in bits.items()}}


def floors_sentence(records: Sequence[dict]) -> str | None:
    """The caption's sentence naming the floors of the runs' corpus (from the first record that
    kept them; None when none did -- records from before floors were kept)."""
    kept = next((r["ngram_floors"] for r in records if isinstance(r.get("ngram_floors"), dict)),
                None)
    if kept is None:
        return None
    bits = kept.get("bits_per_byte") or {}
    shown = [f"{order}-gram {bits[str(order)]:.2f}" for order in FLOOR_ORDERS_SHOWN
             if isinstance(bits.get(str(order)), (int, float))]
    if not shown:
        return None
    return (f"n-gram floors (interpolated Kneser-Ney on the training split, scored on the "
            f"test split in {kept.get('window')}-byte windows, bits per byte): "
            f"{', '.join(shown)}; a row above a floor has not learned past that n-gram.")
