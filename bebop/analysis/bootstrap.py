"""Bootstrap intervals that respect how the data were sampled, and the three-way verdict they give.

The units that are resampled are the ones that are (close to) independent:

- **RL steps** form a time series: neighbouring steps share a policy, so their residuals are
  correlated and a fit that treats them as independent is overconfident. ``step_weights``
  resamples circular blocks of ``block_length(S)`` consecutive steps (Politis & Romano 1992),
  each run separately when several runs (seeds) are pooled.
- **Tokens** cluster in completions: the positions of one sequence share a prompt and a prefix.
  ``cluster_weights`` resamples whole sequences, never single tokens.

Every statistic here is a smooth function of per-unit sums (count, sum x, sum y, sum x^2, sum xy),
so a resample is a weight matrix W (B, U) of how often each unit was drawn and its sums are
W @ sums: B = ``NUM_RESAMPLES`` resamples cost a matrix product. Intervals are percentile
intervals of the resampled statistic. The resampling seed is derived from the data (``data_seed``),
so the same data always give the same interval and the same verdict, wherever they are shown, and
different runs are resampled independently (their draws can be combined into intervals of
differences and ratios).

Verdicts (``decide``): the paper claims a quantity lies on one side of a threshold. Our interval
lying wholly on the claimed side is ``REPRODUCED``, wholly on the other side ``NOT_REPRODUCED``;
an interval that contains the threshold cannot separate the claim from its negation at our
sample size: ``INCONCLUSIVE``. For an inconclusive result we say how many more units would decide
it, by the rule n ∝ (half-width / distance)^2: the interval's half-width on the threshold's side
shrinks like 1/sqrt(n) and must fall below the distance from the estimate to the threshold. This is
an extrapolation that assumes the estimate stays where it is; it is stated as such.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence

from statistics import NormalDist

import numpy as np

from bebop.analysis.fit import student_t_quantile

NUM_RESAMPLES = 2000  # percentile intervals at 95% move by ~0.01 standard errors between seeds
CONFIDENCE = 0.95  # coverage of every interval
CHUNK = 256  # resamples per matrix product: bounds memory at CHUNK x units
MIN_FINITE_SHARE = 0.9  # below this share of defined resampled statistics, no interval is given
NUM_SUMS = 5  # per-unit sufficient statistics: count, sum x, sum y, sum x^2, sum x*y

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
INCONCLUSIVE = "inconclusive"


def block_length(num_steps: int) -> int:
    """Block length for S steps: round(sqrt(S)), at least 1.

    Longer than the S^(1/3) that is optimal asymptotically: at the 20-200 steps of our runs, with
    step-to-step correlation, S^(1/3) blocks under-cover (about 89% for a nominal 95% on AR(1)
    residuals with rho = 0.5-0.7), sqrt(S) blocks do not.

    Example: block_length(30) == 5; block_length(1) == 1.
    """
    return max(1, round(math.sqrt(num_steps)))


def num_blocks(num_steps: int) -> int:
    """Blocks drawn per resample of S steps: ceil(S / block_length(S))."""
    return math.ceil(num_steps / block_length(num_steps)) if num_steps > 0 else 0


def _circular_block_counts(num_steps: int, num_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(B, S) how often each step is drawn when ceil(S / l) circular blocks of length l are concatenated
    and cut to S steps."""
    length = block_length(num_steps)
    starts = rng.integers(0, num_steps, size=(num_resamples, num_blocks(num_steps)))  # (B, nb)
    offsets = np.arange(num_blocks(num_steps) * length)[:num_steps]  # the first S of the concatenated positions
    index = (starts[:, offsets // length] + offsets % length) % num_steps  # (B, S)
    flat = (np.arange(num_resamples)[:, None] * num_steps + index).ravel()
    return np.bincount(flat, minlength=num_resamples * num_steps).reshape(num_resamples, num_steps).astype(float)


def step_weights(run_lengths: Sequence[int], num_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(B, sum S_r): circular block bootstrap counts of each run's steps, the runs resampled separately."""
    parts = [_circular_block_counts(s, num_resamples, rng) for s in run_lengths if s > 0]
    return np.concatenate(parts, axis=1) if parts else np.zeros((num_resamples, 0))


def cluster_weights(num_clusters: int, num_resamples: int, rng: np.random.Generator) -> np.ndarray:
    """(B, C): how often each cluster (sequence) is drawn when C clusters are drawn with replacement."""
    if num_clusters == 0:
        return np.zeros((num_resamples, 0))
    index = rng.integers(0, num_clusters, size=(num_resamples, num_clusters))  # (B, C) clusters drawn
    flat = (np.arange(num_resamples)[:, None] * num_clusters + index).ravel()
    return np.bincount(flat, minlength=num_resamples * num_clusters).reshape(num_resamples, num_clusters).astype(float)


def unit_sums(x: np.ndarray, y: np.ndarray, unit: np.ndarray, num_units: int) -> np.ndarray:  # (U, 5)
    """Per-unit (count, sum x, sum y, sum x^2, sum xy) of points (x, y) that belong to ``unit`` (N,)."""
    columns = (np.ones_like(x), x, y, x * x, x * y)
    return np.stack([np.bincount(unit, weights=c, minlength=num_units) for c in columns], axis=-1)


def slope_from_sums(sums: np.ndarray) -> np.ndarray:
    """OLS slope of y on x from sufficient statistics (..., 5); NaN where x has no spread.

    Example: slope_from_sums(unit_sums(np.array([0., 1, 2]), np.array([1., 3, 5]), np.arange(3), 3).sum(0)) == 2.
    """
    n, sx, sy, sxx, sxy = np.moveaxis(sums, -1, 0)
    denominator = n * sxx - sx * sx
    with np.errstate(invalid="ignore", divide="ignore"):
        slope = (n * sxy - sx * sy) / denominator
    return np.where(denominator > 1e-12 * np.maximum(n * sxx, 1e-300), slope, np.nan)


def mean_from_sums(sums: np.ndarray) -> np.ndarray:
    """Mean of y from sufficient statistics (..., 5); NaN for no points."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(sums[..., 0] > 0, sums[..., 2] / sums[..., 0], np.nan)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A statistic, its bootstrap percentile interval, and what was resampled."""

    estimate: float  # the statistic on the data as observed
    ci: tuple[float, float]  # CONFIDENCE percentile interval; NaN when too few resamples are defined
    n: int  # units resampled: RL steps or sequences
    unit: str  # "RL steps" or "sequences"

    def describe(self, spec: str = "+.2f") -> str:
        lo, hi = self.ci
        if not (math.isfinite(lo) and math.isfinite(hi)):
            return f"{self.estimate:{spec}} (no interval)"
        return f"{self.estimate:{spec}} [{lo:{spec}}, {hi:{spec}}]"


def percentile_interval(estimate: float, draws: np.ndarray, n: int, unit: str,
                        confidence: float = CONFIDENCE) -> Interval:
    """The percentile interval of the finite ``draws`` (B,), or NaN bounds if too few are finite."""
    finite = draws[np.isfinite(draws)]
    if not math.isfinite(estimate) or finite.size < MIN_FINITE_SHARE * max(draws.size, 1):
        return Interval(estimate, (math.nan, math.nan), n, unit)
    tail = 100.0 * (1.0 - confidence) / 2.0
    lo, hi = np.percentile(finite, [tail, 100.0 - tail])
    return Interval(estimate, (float(lo), float(hi)), n, unit)


def data_seed(values: np.ndarray) -> int:
    """A resampling seed that is a function of the data: CRC-32 of its float64 bytes."""
    return zlib.crc32(np.ascontiguousarray(values, dtype=np.float64).tobytes())


def widen(estimate: float, draws: np.ndarray, num_units: int, num_params: int,
          confidence: float = CONFIDENCE) -> np.ndarray:
    """Draws spread about the estimate by the small-sample factor t_{u-p} / z * sqrt(u / (u - p)).

    A bootstrap over u independent units (blocks or sequences) underestimates the variance of a
    statistic with p fitted parameters by about (u - p) / u, and its percentiles behave like normal
    quantiles where a t with u - p degrees of freedom fits; both matter at 5-10 blocks and vanish
    at hundreds of sequences. All NaN when u <= p (nothing left to estimate the noise with).

    Example: 10 blocks, a slope (p = 2): factor t_8(0.975) / 1.96 * sqrt(10 / 8) = 1.32.
    """
    dof = num_units - num_params
    if dof < 1:
        return np.full_like(draws, np.nan)
    tail = 0.5 * (1.0 + confidence)
    z = NormalDist().inv_cdf(tail)
    factor = student_t_quantile(tail, dof) / z * math.sqrt(num_units / dof)
    return estimate + factor * (draws - estimate)


def resample(sums: np.ndarray, weights: Callable[[int, np.random.Generator], np.ndarray], statistic: Callable,
             num_resamples: int = NUM_RESAMPLES, seed: int | None = None) -> tuple[float, np.ndarray]:
    """The statistic of the data and of ``num_resamples`` resamples of its units.

    Args:
        sums: (U, ...) per-unit sums; a resample's sums are W @ sums.
        weights: ``weights(num, rng) -> (num, U)`` resampling counts (``step_weights``, ``cluster_weights``).
        statistic: maps summed sums (b, *sums.shape[1:]) to (b,) values; also called on one (*sums.shape[1:]).
        num_resamples: B.
        seed: of the resampling generator; None derives it from ``sums`` (``data_seed``).

    Returns:
        (estimate, draws (B,)), draws not yet widened. A statistic with trailing dims (G,) gives an
        estimate (G,) and draws (B, G).
    """
    rng = np.random.default_rng(data_seed(sums) if seed is None else seed)
    flat = sums.reshape(sums.shape[0], int(np.prod(sums.shape[1:])))  # (U, F)
    estimate = np.asarray(statistic(flat.sum(0).reshape(sums.shape[1:])), dtype=float)
    estimate = float(estimate) if estimate.ndim == 0 else estimate
    draws = []
    for start in range(0, num_resamples, CHUNK):
        w = weights(min(CHUNK, num_resamples - start), rng)  # (b, U)
        draws.append(np.asarray(statistic((w @ flat).reshape(-1, *sums.shape[1:])), dtype=float))
    return estimate, np.concatenate(draws)


def over_steps(sums: np.ndarray, run_lengths: Sequence[int], statistic: Callable, num_params: int,
               seed: int | None = None) -> tuple[Interval, np.ndarray]:
    """Block bootstrap over RL steps: ``sums`` (S_total, ...) one unit per step, runs concatenated.

    Returns:
        (interval, widened draws (B,)); the draws combine with other independent bootstraps.
    """
    estimate, draws = resample(sums, lambda b, rng: step_weights(run_lengths, b, rng), statistic, seed=seed)
    draws = widen(estimate, draws, sum(num_blocks(s) for s in run_lengths), num_params)
    return percentile_interval(estimate, draws, int(sum(run_lengths)), "RL steps"), draws


def over_sequences(sums: np.ndarray, statistic: Callable, num_params: int, seed: int | None = None,
                   unit: str = "sequences") -> tuple[Interval, np.ndarray]:
    """Bootstrap over sequences: ``sums`` (C, ...) one unit per sequence. Returns (interval, widened draws)."""
    num = sums.shape[0]
    estimate, draws = resample(sums, lambda b, rng: cluster_weights(num, b, rng), statistic, seed=seed)
    draws = widen(estimate, draws, num, num_params)
    return percentile_interval(estimate, draws, num, unit), draws


def steps_slope(runs: Sequence[tuple[np.ndarray, np.ndarray]], seed: int | None = None) -> tuple[Interval, np.ndarray]:
    """Slope of y on x pooled over runs, one point per RL step, with a block bootstrap over steps.

    Args:
        runs: per run, (x (S,), y (S,)); non-finite pairs are dropped.
        seed: resampling seed; None derives it from the data.

    Returns:
        (the interval, the draws (B,)): the draws let callers combine slopes of independent runs.
    """
    kept = [(x[m], y[m]) for x, y in runs for m in [np.isfinite(x) & np.isfinite(y)]]
    x = np.concatenate([x for x, _ in kept]) if kept else np.zeros(0)
    y = np.concatenate([y for _, y in kept]) if kept else np.zeros(0)
    sums = unit_sums(x, y, np.arange(x.size), x.size)  # (S, 5): one unit per step
    return over_steps(sums, [x.size for x, _ in kept], slope_from_sums, num_params=2, seed=seed)


def steps_line(runs: Sequence[tuple[np.ndarray, np.ndarray]], grid: np.ndarray,
               seed: int | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pooled OLS line of ``steps_slope`` at ``grid`` (G,) and its pointwise CONFIDENCE band.

    Returns:
        (line (G,), band low (G,), band high (G,)); NaN where the line is undefined.
    """
    kept = [(x[m], y[m]) for x, y in runs for m in [np.isfinite(x) & np.isfinite(y)]]
    x = np.concatenate([x for x, _ in kept]) if kept else np.zeros(0)
    y = np.concatenate([y for _, y in kept]) if kept else np.zeros(0)
    sums = unit_sums(x, y, np.arange(x.size), x.size)  # (S, 5)

    def predict(s: np.ndarray) -> np.ndarray:  # (..., 5) -> (..., G)
        slope = slope_from_sums(s)[..., None]
        with np.errstate(invalid="ignore", divide="ignore"):
            intercept = (s[..., 2:3] - slope * s[..., 1:2]) / s[..., 0:1]
        return intercept + slope * grid

    lengths = [v.size for v, _ in kept]
    line, draws = resample(sums, lambda b, rng: step_weights(lengths, b, rng), predict, seed=seed)  # (G,), (B, G)
    draws = widen(line, draws, sum(num_blocks(n) for n in lengths), num_params=2)
    if not np.isfinite(draws).all():  # too few steps or blocks: a line, maybe, but no band
        return line, np.full(grid.shape, np.nan), np.full(grid.shape, np.nan)
    tail = 100.0 * (1.0 - CONFIDENCE) / 2.0
    low, high = np.percentile(draws, [tail, 100.0 - tail], axis=0)
    return line, low, high


def steps_mean(runs: Sequence[np.ndarray], seed: int | None = None) -> tuple[Interval, np.ndarray]:
    """Mean of y over the steps of the runs, with a block bootstrap over steps; returns (interval, draws)."""
    ys = [y[np.isfinite(y)] for y in runs]
    y = np.concatenate(ys) if ys else np.zeros(0)
    sums = unit_sums(np.zeros_like(y), y, np.arange(y.size), y.size)
    return over_steps(sums, [v.size for v in ys], mean_from_sums, num_params=1, seed=seed)


def sequences_slope(x: np.ndarray, y: np.ndarray, sequence: np.ndarray, seed: int | None = None) -> Interval:
    """Slope of y on x over token-level points, with a bootstrap over sequences (``sequence`` (N,) ids)."""
    keep = np.isfinite(x) & np.isfinite(y)
    _, index = np.unique(sequence[keep], return_inverse=True)
    sums = unit_sums(x[keep], y[keep], index.reshape(-1), int(index.max()) + 1 if index.size else 0)
    return over_sequences(sums, slope_from_sums, num_params=2, seed=seed)[0]


def window_change(values: np.ndarray, frac: float, seed: int | None = None) -> tuple[float, float, Interval]:
    """Mean of the first and last ``frac`` of the steps, and their difference with a block-bootstrap interval.

    Each window (at least one step) is resampled on its own, in circular blocks.

    Returns:
        (start mean, end mean, Interval of end - start over RL steps).
    """
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    size = max(1, int(values.size * frac))
    start, start_draws = steps_mean([values[:size]], seed=seed)
    end, end_draws = steps_mean([values[-size:]], seed=None if seed is None else seed + 1)
    change = percentile_interval(end.estimate - start.estimate, end_draws - start_draws, 2 * size, "RL steps")
    return start.estimate, end.estimate, change


# --------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Decision:
    """A verdict on "quantity is above (or below) threshold", and the facts behind it."""

    verdict: str  # REPRODUCED | NOT_REPRODUCED | INCONCLUSIVE
    note: str  # one sentence: where the interval lies; for INCONCLUSIVE, how many more units would decide
    more_units: float = math.nan  # factor on the sample size that would decide an inconclusive result


def samples_to_decide(interval: Interval, threshold: float) -> float:
    """Factor on n after which the interval would exclude ``threshold``, if the estimate stayed put.

    n ∝ (half-width / distance)^2, with the half-width on the threshold's side. Infinite when the
    estimate is on the threshold; NaN without an interval.

    Example: estimate 1, interval [-1, 3], threshold 0: half-width 2, distance 1 -> 4.0 (4x the data).
    """
    lo, hi = interval.ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return math.nan
    distance = abs(interval.estimate - threshold)
    half_width = interval.estimate - lo if threshold < interval.estimate else hi - interval.estimate
    return math.inf if distance == 0 else (half_width / distance) ** 2


def decide(interval: Interval, threshold: float, claim: str, what: str, spec: str = "+.2f") -> Decision:
    """The verdict on the paper's claim that ``what`` is ``claim`` ("below" | "above") ``threshold``.

    Args:
        interval: our estimate and interval of the quantity.
        threshold: the boundary between the claim and its negation.
        claim: "below" or "above".
        what: the quantity in words, for the note (e.g. "the TO slope").
        spec: format of the numbers in the note.

    Returns:
        The ``Decision``; without an interval it is INCONCLUSIVE with the reason.
    """
    if claim not in ("below", "above"):
        raise ValueError(f"claim must be 'below' or 'above', got {claim!r}")
    lo, hi = interval.ci
    text = f"{what} {interval.describe(spec)} ({CONFIDENCE:.0%} interval over {interval.n} {interval.unit})"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return Decision(INCONCLUSIVE, f"{what} has no interval (too few {interval.unit} or no spread)")
    claimed = hi < threshold if claim == "below" else lo > threshold
    negated = lo >= threshold if claim == "below" else hi <= threshold
    if claimed:
        return Decision(REPRODUCED, f"{text} lies {claim} {threshold:g}")
    if negated:
        return Decision(NOT_REPRODUCED, f"{text} does not lie {claim} {threshold:g}, nor does any of its interval")
    factor = samples_to_decide(interval, threshold)
    side = "the claim" if (interval.estimate < threshold) == (claim == "below") else "its negation"
    if math.isinf(factor):
        more = "the estimate sits on the threshold, so no sample size would decide it"
    else:
        more = (f"about {factor:.1f}× the {interval.unit} ({interval.n} → {math.ceil(factor * interval.n)}) would "
                f"decide it toward {side} if the estimate stayed at {interval.estimate:+.3g} "
                f"(extrapolation: n ∝ (half-width / distance)²)")
    return Decision(INCONCLUSIVE, f"{text} contains {threshold:g}: {more}", factor)
