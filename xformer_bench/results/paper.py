"""Rank agreement between a measured and a published ordering of rows: Spearman's rho (on
average ranks, so ties share their mean rank; Spearman 1904), Kendall's tau-b (ties corrected;
Kendall 1945), and a percentile bootstrap interval over seeds (Efron & Tibshirani 1993): each
row's seeds resampled with replacement, the statistic recomputed on the resampled means.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

DRAWS = 1000
RNG_SEED = 0
INTERVAL = (2.5, 97.5)   # percent


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of the ranks they span."""
    array = np.asarray(values, dtype=float)
    order = np.argsort(array, kind="mergesort")
    ranks = np.empty(array.size)
    start = 0
    while start < array.size:
        end = start
        while end + 1 < array.size and array[order[end + 1]] == array[order[start]]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman_rho(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's correlation of the average ranks; nan when either side is constant."""
    rx, ry = average_ranks(x) - (len(x) + 1) / 2, average_ranks(y) - (len(y) + 1) / 2
    denominator = math.sqrt(float(rx @ rx) * float(ry @ ry))
    return float(rx @ ry) / denominator if denominator else math.nan


def kendall_tau_b(x: Sequence[float], y: Sequence[float]) -> float:
    """(concordant - discordant) / sqrt((n0 - tied in x) (n0 - tied in y)), n0 = n(n-1)/2
    pairs; nan when either side is constant."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    upper = np.triu_indices(x.size, k=1)
    dx = np.sign(x[:, None] - x[None, :])[upper]
    dy = np.sign(y[:, None] - y[None, :])[upper]
    untied_x, untied_y = np.count_nonzero(dx), np.count_nonzero(dy)
    denominator = math.sqrt(float(untied_x) * float(untied_y))
    return float(np.sum(dx * dy)) / denominator if denominator else math.nan


Statistic = Callable[[Sequence[float], Sequence[float]], float]


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def text(self) -> str:
        if math.isnan(self.value):
            return "undefined"
        return f"{self.value:.2f} [{self.low:.2f}, {self.high:.2f}]"


def bootstrap(statistic: Statistic, seeds_per_row: Sequence[Sequence[float]],
              published: Sequence[float], draws: int = DRAWS, rng_seed: int = RNG_SEED) -> Estimate:
    """``statistic`` of the rows' seed means against ``published``, with the
    :data:`INTERVAL` percentiles of ``draws`` resamplings of each row's seeds."""
    point = statistic([float(np.mean(s)) for s in seeds_per_row], published)
    rng = np.random.default_rng(rng_seed)
    arrays = [np.asarray(s, dtype=float) for s in seeds_per_row]
    samples = [statistic([float(rng.choice(a, a.size).mean()) for a in arrays], published)
               for _ in range(draws)]
    finite = [s for s in samples if not math.isnan(s)]
    if not finite:
        return Estimate(point, math.nan, math.nan)
    low, high = np.percentile(finite, INTERVAL)
    return Estimate(point, float(low), float(high))
