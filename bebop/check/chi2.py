"""Pearson's two-sample chi-square test of homogeneity, with its own chi-square survival function.

Used by ``bebop.check.lossless``: two samples of categories (tokens, token pairs) are laid out as a
2 x C table, rare categories pooled so every cell expects >= ``MIN_EXPECTED`` counts in both
samples, and the statistic compared with chi-square(C - 1). The survival function is computed
here (regularized upper incomplete gamma), so scipy stays a development-only dependency.
"""

from __future__ import annotations

import math
from collections import Counter

MIN_EXPECTED = 5.0  # expected count every chi-square cell needs in both samples
GAMMA_EPS = 1e-15  # relative accuracy of the incomplete-gamma series and continued fraction
GAMMA_MAX_ITER = 10_000  # enough for dof up to ~1e6 (iterations grow like sqrt(dof))
GAMMA_TINY = 1e-300  # Lentz's guard against division by zero


def _gamma_p_series(a: float, x: float) -> float:
    """Regularized lower incomplete gamma P(a, x) by its power series (converges fast for x < a + 1)."""
    term = total = 1.0 / a
    denominator = a
    for _ in range(GAMMA_MAX_ITER):
        denominator += 1.0
        term *= x / denominator
        total += term
        if abs(term) < abs(total) * GAMMA_EPS:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))


def _gamma_q_continued_fraction(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x) by its continued fraction (modified Lentz; x >= a + 1).

    Q(a, x) = e^-x x^a / Gamma(a) * 1 / (x + 1 - a - 1 (1 - a) / (x + 3 - a - 2 (2 - a) / (x + 5 - a - ...))).
    """
    b = x + 1.0 - a
    c = 1.0 / GAMMA_TINY
    d = 1.0 / b
    h = d
    for i in range(1, GAMMA_MAX_ITER):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = GAMMA_TINY if abs(d) < GAMMA_TINY else d
        c = b + an / c
        c = GAMMA_TINY if abs(c) < GAMMA_TINY else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < GAMMA_EPS:
            break
    return h * math.exp(-x + a * math.log(x) - math.lgamma(a))


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square with ``dof`` degrees of freedom: Q(dof / 2, statistic / 2).

    Accurate to ~1e-13 relative (tested against scipy.stats.chi2.sf); underflows to 0 below ~1e-300.

    Example: chi2_sf(3.841, 1) ~= 0.05; chi2_sf(0, 4) == 1.0.
    """
    if dof < 1:
        raise ValueError(f"dof must be >= 1, got {dof}")
    if statistic <= 0:
        return 1.0
    a, x = dof / 2.0, statistic / 2.0
    if x < a + 1.0:
        return max(0.0, 1.0 - _gamma_p_series(a, x))
    return _gamma_q_continued_fraction(a, x)


def pool_rare_cells(
    first: Counter, second: Counter, min_expected: float = MIN_EXPECTED
) -> tuple[list[int], list[int]]:
    """Aligned cell counts of two samples, rare categories pooled so each cell expects >= min_expected.

    A category's expected count in a sample is its pooled share times that sample's size; categories
    below ``min_expected`` in either sample go to one OTHER cell, which is folded into the smallest
    kept cell if it is itself too small.

    Example: first = {a: 50, b: 50, c: 1}, second = {a: 48, b: 52, d: 2} -> ([50, 51], [52, 50])
    (cells b, a; c and d expect 1.5 together, too few for a cell of their own, so they join a).
    """
    n1, n2 = sum(first.values()), sum(second.values())
    total = n1 + n2
    smaller = min(n1, n2)
    categories = sorted(set(first) | set(second), key=lambda c: -(first[c] + second[c]))
    kept = [c for c in categories if smaller * (first[c] + second[c]) / total >= min_expected]
    kept_set = set(kept)
    rare = [c for c in categories if c not in kept_set]
    cells1, cells2 = [first[c] for c in kept], [second[c] for c in kept]
    if rare:
        other1, other2 = sum(first[c] for c in rare), sum(second[c] for c in rare)
        if smaller * (other1 + other2) / total >= min_expected or not kept:
            cells1.append(other1)
            cells2.append(other2)
        else:
            cells1[-1] += other1  # kept is sorted by count, so the last kept cell is the smallest
            cells2[-1] += other2
    return cells1, cells2


def two_sample_chi2(first: Counter, second: Counter) -> tuple[float, int, float]:
    """Pearson's chi-square test that two samples of categories come from one distribution.

    Returns (statistic, dof, p_value). With fewer than two cells after pooling there is nothing to
    compare: (0.0, 0, 1.0).
    """
    cells1, cells2 = pool_rare_cells(first, second)
    if len(cells1) < 2:
        return 0.0, 0, 1.0
    n1, n2 = sum(cells1), sum(cells2)
    total = n1 + n2
    statistic = 0.0
    for o1, o2 in zip(cells1, cells2):
        share = (o1 + o2) / total
        e1, e2 = n1 * share, n2 * share
        statistic += (o1 - e1) ** 2 / e1 + (o2 - e2) ** 2 / e2
    dof = len(cells1) - 1
    return statistic, dof, chi2_sf(statistic, dof)
