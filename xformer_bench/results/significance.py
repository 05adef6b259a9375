"""Welch's t-test (Welch 1947) of two rows' means from their mean, sample std and seed count,
and Holm's (1979) step-down correction over a study's rows.

``t = (m1 - m2) / sqrt(s1^2/n1 + s2^2/n2)`` with the Welch-Satterthwaite degrees of freedom;
the two-sided p-value is ``I_{df/(df+t^2)}(df/2, 1/2)``, the regularised incomplete beta
function, evaluated here by its continued fraction (Press et al., Numerical Recipes, 6.4).
Written here rather than taken from scipy: scipy would be one more dependency, and torchmetrics
imports it when present, which slows every ``xbench`` start.
"""

from __future__ import annotations

import math

ALPHA = 0.05


def _continued_fraction(x: float, a: float, b: float, iterations: int = 300) -> float:
    """Lentz's evaluation of the incomplete beta continued fraction."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, iterations + 1):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < eps:
            break
    return fraction


def regularized_incomplete_beta(x: float, a: float, b: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
                 + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _continued_fraction(x, a, b) / a
    return 1.0 - math.exp(log_front) * _continued_fraction(1.0 - x, b, a) / b


def welch_p_value(mean1: float, std1: float, n1: int, mean2: float, std2: float,
                  n2: int) -> float | None:
    """Two-sided p-value that the two means are equal; None when the test cannot be made:
    fewer than 2 seeds a side, or no variance on either side (t is undefined: equal seeds
    prove nothing about the spread, so differing means are not called significant)."""
    if n1 < 2 or n2 < 2:
        return None
    v1, v2 = std1 ** 2 / n1, std2 ** 2 / n2
    if v1 + v2 == 0.0:
        return None
    t = (mean1 - mean2) / math.sqrt(v1 + v2)
    df = (v1 + v2) ** 2 / (v1 ** 2 / (n1 - 1) + v2 ** 2 / (n2 - 1))
    return regularized_incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def holm_bonferroni(p_values: list[float | None], alpha: float = ALPHA) -> list[bool]:
    """Which of ``p_values`` are significant with the family-wise error rate held at ``alpha``
    (Holm 1979): sort the m testable p-values ascending, p_(1) <= ... <= p_(m); reject H_(k)
    while p_(k) <= alpha / (m - k + 1), and none after the first that is not.  None (not
    testable) takes no part and is never significant."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    significant = [False] * len(p_values)
    for rank, (p, i) in enumerate(tested):
        if p > alpha / (len(tested) - rank):
            break
        significant[i] = True
    return significant
