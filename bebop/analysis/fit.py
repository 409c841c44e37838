"""Fits behind the paper's analyses: acceptance versus entropy, entropy versus mismatch, RS versus TO.

Terms (arXiv 2606.12370; p is the target distribution, q the draft's):

- alpha_RS = sum_v min(p(v), q(v)) = 1 - TV(p, q): acceptance of a sampled draft under rejection
  sampling (Eq. 2).
- alpha_TO = p(argmax q): acceptance of a greedy draft under target-only verification (Eq. 1).
- accept length: 1 + accepted drafts per verify pass (the vLLM/SGLang convention); its expectation
  is 1 + sum_j prod_{i<=j} alpha_i (Eq. 12 plus the bonus token).
- entropy slope: the fitted slope of acceptance (or accept length) against the target entropy
  H(p) in nats (Props. 1 and 2; Fig. 8 reports -1.68 for TO/RS-CE and -0.06 for RS-TV).

Everything here is plain numpy plus the standard library; the Student-t quantile used for
confidence intervals is computed in this module (no scipy at runtime).
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import numpy as np

MAX_CONTINUED_FRACTION_TERMS = 10_000  # ample: terms needed grow like sqrt(a) for I_x(a, b)
CONTINUED_FRACTION_EPS = 1e-15  # relative change at which the continued fraction has converged
LENTZ_TINY = 1e-300  # stands in for a zero denominator in Lentz's method
MAX_BISECTION_STEPS = 400  # halvings of the t bracket; far more than float64 resolution needs


# --------------------------------------------------------------------------------------------
# Student-t quantile (regularised incomplete beta by continued fraction, then bisection)
# --------------------------------------------------------------------------------------------


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Evaluates the continued fraction of I_x(a, b) (DLMF 8.17.22) by the modified Lentz method.

    Converges quickly for x < (a + 1) / (a + b + 2); callers use the symmetry
    I_x(a, b) = 1 - I_{1-x}(b, a) otherwise.
    """

    def _step(coeff: float, c: float, d: float) -> tuple[float, float, float]:
        d = 1.0 + coeff * d
        d = 1.0 / (d if abs(d) > LENTZ_TINY else LENTZ_TINY)
        c = 1.0 + coeff / c
        c = c if abs(c) > LENTZ_TINY else LENTZ_TINY
        return c, d, c * d

    d = 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > LENTZ_TINY else LENTZ_TINY)
    c, frac = 1.0, d
    for m in range(1, MAX_CONTINUED_FRACTION_TERMS):
        even = m * (b - m) * x / ((a + 2 * m - 1.0) * (a + 2 * m))
        c, d, delta = _step(even, c, d)
        frac *= delta
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1.0))
        c, d, delta = _step(odd, c, d)
        frac *= delta
        if abs(delta - 1.0) < CONTINUED_FRACTION_EPS:
            break
    return frac


def regularized_incomplete_beta(a: float, b: float, x: float, y: float | None = None) -> float:
    """Computes I_x(a, b), the regularised incomplete beta function.

    Args:
        a: First shape parameter, > 0.
        b: Second shape parameter, > 0.
        x: Point in [0, 1].
        y: 1 - x, if the caller knows it more accurately than ``1 - x`` (avoids cancellation
            when x is close to 1).

    Returns:
        I_x(a, b) in [0, 1].

    Example:
        >>> round(regularized_incomplete_beta(1.0, 1.0, 0.25), 12)  # uniform CDF
        0.25
    """
    y = 1.0 - x if y is None else y
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = a * math.log(x) + b * math.log(y) - (math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b))
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, y) / b


def student_t_sf(t: float, dof: float) -> float:
    """Upper tail P(T > t) of Student's t with ``dof`` degrees of freedom, for t >= 0.

    Uses P(T > t) = I_{dof/(dof+t^2)}(dof/2, 1/2) / 2, passing both x and 1 - x so small and large
    t keep full relative precision.
    """
    t2 = t * t
    x = dof / (dof + t2)
    y = t2 / (dof + t2)
    return 0.5 * regularized_incomplete_beta(0.5 * dof, 0.5, x, y)


def student_t_quantile(prob: float, dof: float) -> float:
    """Inverse CDF of Student's t distribution (what scipy calls ``t.ppf``).

    Brackets the answer and bisects on the upper tail, so the result is accurate to a few ulps
    of float64 (checked against scipy to 1e-6 relative in the tests).

    Args:
        prob: Lower-tail probability in (0, 1).
        dof: Degrees of freedom, > 0 (need not be an integer).

    Returns:
        t such that P(T <= t) = prob.

    Raises:
        ValueError: If prob is not in (0, 1) or dof is not positive.

    Example:
        >>> round(student_t_quantile(0.975, 1.0), 6)  # Cauchy: tan(0.475 pi)
        12.706205
    """
    if not 0.0 < prob < 1.0:
        raise ValueError(f"prob must be in (0, 1), got {prob}")
    if not dof > 0.0:
        raise ValueError(f"dof must be > 0, got {dof}")
    if prob == 0.5:
        return 0.0
    tail = min(prob, 1.0 - prob)  # NOTE: keep the small tail itself, never 1 - tiny
    hi = 1.0
    while student_t_sf(hi, dof) > tail:
        hi *= 2.0
    lo = 0.0
    for _ in range(MAX_BISECTION_STEPS):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if student_t_sf(mid, dof) > tail:
            lo = mid
        else:
            hi = mid
    t = 0.5 * (lo + hi)
    return t if prob > 0.5 else -t


# --------------------------------------------------------------------------------------------
# Linear fits
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LinearFit:
    """An ordinary least-squares line y = intercept + slope * x with confidence intervals.

    Undefined quantities are NaN (see ``linear_fit`` for when).
    """

    slope: float  # dy/dx
    intercept: float  # y at x = 0
    r: float  # Pearson correlation of x and y
    slope_ci: tuple[float, float]  # two-sided interval for the slope at ``confidence``
    intercept_ci: tuple[float, float]  # two-sided interval for the intercept at ``confidence``
    n: int  # number of finite (x, y) pairs used
    confidence: float  # coverage of the intervals, e.g. 0.95
    slope_stderr: float  # standard error of the slope
    intercept_stderr: float  # standard error of the intercept

    def predict(self, x: np.ndarray | float) -> np.ndarray:
        """Evaluates the fitted line at ``x``."""
        return self.intercept + self.slope * np.asarray(x, dtype=float)


def _finite_pairs(x: np.ndarray | list, y: np.ndarray | list) -> tuple[np.ndarray, np.ndarray]:
    """Returns float copies of x and y without the pairs where either is NaN or infinite."""
    x = np.asarray(x, dtype=float).ravel()
    y = np.asarray(y, dtype=float).ravel()
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same length, got {x.shape[0]} and {y.shape[0]}")
    keep = np.isfinite(x) & np.isfinite(y)
    return x[keep], y[keep]


def linear_fit(x: np.ndarray | list, y: np.ndarray | list, confidence: float = 0.95) -> LinearFit:
    """Fits y = intercept + slope * x by ordinary least squares.

    Intervals use Student's t with n - 2 degrees of freedom: slope +- t * slope_stderr, matching
    ``scipy.stats.linregress``. Pairs where x or y is NaN/inf are dropped first (so a metric that
    is null on some steps can be passed as is). Degenerate data never raises:

    1. n < 2 or zero variance in x: slope, intercept, r, errors and intervals are NaN.
    2. n == 2: the line is exact; r is +-1; errors and intervals are NaN (no residual dof).
    3. zero variance in y (and in x not): slope 0, r NaN, errors and intervals from the residuals.

    Args:
        x: Predictor, shape (N,).
        y: Response, shape (N,).
        confidence: Coverage of the two-sided intervals, in (0, 1).

    Returns:
        The fit.

    Raises:
        ValueError: If x and y differ in length or confidence is not in (0, 1).

    Example:
        >>> linear_fit([0, 1, 2], [1, 3, 5]).slope
        2.0
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    x, y = _finite_pairs(x, y)
    n = int(x.size)
    nan2 = (math.nan, math.nan)
    sxx = float(np.sum((x - x.mean()) ** 2)) if n else 0.0
    if n < 2 or sxx == 0.0:
        return LinearFit(math.nan, math.nan, math.nan, nan2, nan2, n, confidence, math.nan, math.nan)
    dx, dy = x - x.mean(), y - y.mean()
    syy = float(np.sum(dy**2))
    slope = float(np.sum(dx * dy)) / sxx
    intercept = float(y.mean() - slope * x.mean())
    r = float(np.clip(np.sum(dx * dy) / math.sqrt(sxx * syy), -1.0, 1.0)) if syy > 0.0 else math.nan
    if n == 2:
        return LinearFit(slope, intercept, r, nan2, nan2, n, confidence, math.nan, math.nan)
    residual = y - (intercept + slope * x)
    slope_se = math.sqrt(float(np.sum(residual**2)) / (n - 2) / sxx)
    intercept_se = slope_se * math.sqrt(float(np.mean(x**2)))
    t = student_t_quantile(0.5 * (1.0 + confidence), n - 2)
    return LinearFit(
        slope=slope,
        intercept=intercept,
        r=r,
        slope_ci=(slope - t * slope_se, slope + t * slope_se),
        intercept_ci=(intercept - t * intercept_se, intercept + t * intercept_se),
        n=n,
        confidence=confidence,
        slope_stderr=slope_se,
        intercept_stderr=intercept_se,
    )


class BucketedFit(NamedTuple):
    """Acceptance averaged in entropy buckets (for plotting) plus a fit over the raw points."""

    centers: np.ndarray  # (M,) mean entropy of the points in each kept bucket, nats
    means: np.ndarray  # (M,) mean acceptance in each kept bucket
    counts: np.ndarray  # (M,) points per kept bucket, each >= min_count
    fit: LinearFit  # acceptance ~ entropy over every finite raw point, not over bucket means


def bucketed_fit(
    entropy: np.ndarray | list,  # (N,) nats
    accept: np.ndarray | list,  # (N,)
    num_buckets: int = 10,
    min_count: int = 20,
    confidence: float = 0.95,
) -> BucketedFit:
    """Buckets token-level acceptance by entropy and fits acceptance against entropy.

    Choices, stated once:

    1. Buckets have equal counts (edges at entropy quantiles), because token entropies pile up
       near 0 and equal-width buckets would leave most of them empty. Tied edges are merged, so
       fewer than ``num_buckets`` may come back.
    2. A bucket's center is the mean entropy of its points, not the midpoint of its edges.
    3. Buckets with fewer than ``min_count`` points are dropped from the returned arrays.
    4. The fit uses every finite raw point, so each token weighs the same; the bucket means are
       only for drawing. Its t interval treats the points as independent, which tokens of one
       sequence are not: for an interval use ``bootstrap.sequences_slope``.

    Args:
        entropy: Target entropy H(p) per token, nats.
        accept: Acceptance per token (alpha_RS, alpha_TO or a 0/1 outcome).
        num_buckets: Number of quantile buckets requested, >= 1.
        min_count: Minimum points for a bucket to be reported.
        confidence: Coverage of the fit's intervals.

    Returns:
        The bucket centers, means, counts and the raw-point fit.
    """
    if num_buckets < 1:
        raise ValueError(f"num_buckets must be >= 1, got {num_buckets}")
    h, a = _finite_pairs(entropy, accept)
    fit = linear_fit(h, a, confidence)
    if h.size == 0:
        empty = np.zeros(0)
        return BucketedFit(empty, empty, np.zeros(0, dtype=int), fit)
    edges = np.unique(np.quantile(h, np.linspace(0.0, 1.0, num_buckets + 1)))
    index = np.clip(np.searchsorted(edges, h, side="right") - 1, 0, max(edges.size - 2, 0))  # (N,)
    counts = np.bincount(index, minlength=max(edges.size - 1, 1))
    keep = counts >= max(min_count, 1)
    safe = np.maximum(counts, 1)
    centers = np.bincount(index, weights=h, minlength=counts.size) / safe
    means = np.bincount(index, weights=a, minlength=counts.size) / safe
    return BucketedFit(centers[keep], means[keep], counts[keep], fit)


# --------------------------------------------------------------------------------------------
# The paper's decompositions and rules
# --------------------------------------------------------------------------------------------


def entropy_mismatch_split(
    entropy: np.ndarray | list,  # (S,) mean target entropy per RL step, nats
    alpha: np.ndarray | list,  # (S,) acceptance (or accept length) per RL step
    early_frac: float = 0.3,
) -> dict:
    """Splits the change in acceptance over RL into an entropy part and a mismatch part (Eq. 16).

    With t the step index and 0 the first step:

        delta_alpha_t   = alpha_t - alpha_0
        entropy_part_t  = b * (H_t - H_0)
        mismatch_part_t = delta_alpha_t - entropy_part_t

    Sign convention: ``b`` is the fitted slope d(alpha)/dH itself, so it is negative when
    acceptance falls as entropy rises (the paper's Props. 1-2 write alpha = a - b' H with
    b' = -b > 0). It is fitted on the first ``early_frac`` of the steps (at least 3, at most S),
    where the draft has not yet drifted from the policy, so what it misses later is mismatch.
    If that fit is degenerate (constant early entropy) b is NaN and so are both parts.

    Args:
        entropy: Mean target entropy per step, nats.
        alpha: Acceptance per step, in the same units the parts come back in.
        early_frac: Share of the steps used to fit b, in (0, 1].

    Returns:
        dict with ``delta_alpha``, ``entropy_part``, ``mismatch_part`` (arrays (S,)), ``slope``
        (b), ``slope_fit`` (the LinearFit), ``num_early`` (steps fitted), ``entropy0`` (H_0) and
        ``alpha0`` (alpha_0).

    Raises:
        ValueError: If the inputs differ in length, are empty, or early_frac is not in (0, 1].
    """
    h = np.asarray(entropy, dtype=float).ravel()
    a = np.asarray(alpha, dtype=float).ravel()
    if h.shape != a.shape or h.size == 0:
        raise ValueError(f"entropy and alpha must be non-empty and equal in length, got {h.size} and {a.size}")
    if not 0.0 < early_frac <= 1.0:
        raise ValueError(f"early_frac must be in (0, 1], got {early_frac}")
    num_early = min(h.size, max(3, math.ceil(early_frac * h.size)))
    fit = linear_fit(h[:num_early], a[:num_early])
    delta_alpha = a - a[0]
    entropy_part = fit.slope * (h - h[0])
    return {
        "delta_alpha": delta_alpha,
        "entropy_part": entropy_part,
        "mismatch_part": delta_alpha - entropy_part,
        "slope": fit.slope,
        "slope_fit": fit,
        "num_early": num_early,
        "entropy0": float(h[0]),
        "alpha0": float(a[0]),
    }


def rs_vs_to(
    alpha_rs: np.ndarray | list,  # (N,) sum_v min(p, q) at each position
    alpha_to: np.ndarray | list,  # (N,) p(argmax q) at each position
    atol: float = 1e-12,
) -> dict:
    """Counts where rejection sampling beats target-only verification (App. E, Eq. 48).

    RS wins at a position exactly when TV(p, q) < 1 - p(argmax q), i.e. alpha_RS > alpha_TO.
    Differences within ``atol`` are ties. Non-finite pairs are dropped; with none left the
    shares are NaN.

    Args:
        alpha_rs: Counterfactual RS acceptance per position.
        alpha_to: Counterfactual TO acceptance per position.
        atol: Absolute difference below which the two count as equal.

    Returns:
        dict with ``share_rs_wins``, ``share_to_wins``, ``share_tie`` (fractions summing to 1)
        and ``n`` (positions counted).

    Example:
        >>> rs_vs_to([0.9, 0.5, 0.7, 0.4], [0.8, 0.6, 0.7, 0.1])["share_rs_wins"]
        0.5
    """
    rs, to = _finite_pairs(alpha_rs, alpha_to)
    n = int(rs.size)
    if n == 0:
        return {"share_rs_wins": math.nan, "share_to_wins": math.nan, "share_tie": math.nan, "n": 0}
    diff = rs - to
    rs_wins = int(np.sum(diff > atol))
    to_wins = int(np.sum(diff < -atol))
    return {
        "share_rs_wins": rs_wins / n,
        "share_to_wins": to_wins / n,
        "share_tie": (n - rs_wins - to_wins) / n,
        "n": n,
    }


def expected_accept_length(alphas: np.ndarray | list) -> float:
    """Expected accept length 1 + sum_j prod_{i<=j} alpha_i (Eq. 12 plus the bonus token).

    Args:
        alphas: Per-position acceptance, shape (K,) or (N, K); for (N, K) each row is one
            draft chain and the mean over rows is returned.

    Returns:
        Expected tokens per verify pass, in [1, K + 1].

    Example:
        >>> expected_accept_length([0.5, 0.5])  # 1 + 0.5 + 0.25
        1.75
    """
    a = np.asarray(alphas, dtype=float)
    if a.ndim not in (1, 2):
        raise ValueError(f"alphas must have shape (K,) or (N, K), got {a.shape}")
    a = a.reshape(-1, a.shape[-1])  # (N, K)
    per_row = 1.0 + np.cumprod(a, axis=1).sum(axis=1)  # (N,)
    return float(per_row.mean())
