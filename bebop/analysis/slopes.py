"""Accept length against entropy (and against RL step), from the sources the findings can use, with intervals.

Sources of an accept-length-vs-entropy slope (accept length per nat):

(a) ``steps_estimate``: one point (mean H(p), accept length) per RL step, the runs of one role
    pooled (Fig. 8). Interval: block bootstrap over RL steps (``bootstrap.steps_slope``).
(b) ``sweep_estimate``: one head evaluated at several temperatures (Fig. 12a). Interval: OLS with
    Student's t on the residuals. The points are expectations over one held-out set, so the
    interval measures how far they fall from a line, not sampling noise (which eval-mtp does not
    report).
(c) ``token_estimate``: per draft depth j, alpha_j against H(p_j) over the kept draft positions of
    the runs' token statistics, converted to accept length per nat by the chain rule at the mean
    alpha per depth: dL/dH = sum_i w_i s_i, w_i = d(1 + sum_j prod_{k<=j} alpha_k)/d alpha_i, as if
    H moved by the same amount at every depth. Interval: bootstrap over sequences (whole
    completions), the chain rule recomputed in every resample. Token statistics without completion
    ids (``row``, older files) are resampled by whole RL steps instead.

A source is comparable with >= ``MIN_POINTS`` points spread over >= ``MIN_ENTROPY_RANGE`` nats.
Every estimate keeps its (widened) bootstrap draws, so estimates from independent runs can be
combined (a difference, a ratio) with an interval of their own.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from bebop.analysis import bootstrap
from bebop.analysis.bootstrap import Interval
from bebop.analysis.fit import linear_fit
from bebop.analysis.runs import as_float, metric_column

MIN_ENTROPY_RANGE = 0.05  # nats; a narrower spread of entropies is too little to fit a slope on
MIN_POINTS = 3  # a slope interval needs at least one residual degree of freedom
TOKEN_SOURCE = "token level"  # name of source (c)
STEPS_SOURCE = "RL steps"  # name of source (a)
SWEEP_SOURCE = "temperature sweep"  # name of source (b)


@dataclasses.dataclass(frozen=True)
class SlopeEstimate:
    """A slope from one source with its interval, or why that source cannot give one."""

    source: str  # STEPS_SOURCE, SWEEP_SOURCE or TOKEN_SOURCE
    interval: Interval  # the slope and its CONFIDENCE interval
    r: float  # Pearson correlation of the pooled points (descriptive, not decided on)
    entropy_span: tuple[float, float]  # (min, max) entropy of the points, nats
    reason: str = ""  # why the source is not comparable; "" when it is
    draws: np.ndarray | None = dataclasses.field(default=None, compare=False, repr=False)  # (B,) resampled slopes

    @property
    def slope(self) -> float:
        return self.interval.estimate

    @property
    def ci(self) -> tuple[float, float]:
        return self.interval.ci

    @property
    def comparable(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        if not self.comparable:
            return f"{self.source}: not comparable ({self.reason})"
        h0, h1 = self.entropy_span
        how = " (per-depth α slopes → accept length by the chain rule)" if self.source == TOKEN_SOURCE else ""
        return (f"{self.source}: {self.interval.describe()} /nat over {self.interval.n} {self.interval.unit}, "
                f"r = {self.r:+.2f}, H {h0:.2f}–{h1:.2f} nats{how}")


def unavailable(source: str, reason: str) -> SlopeEstimate:
    return SlopeEstimate(source, Interval(math.nan, (math.nan, math.nan), 0, ""), math.nan, (math.nan, math.nan),
                         reason)


def _check_spread(entropy: np.ndarray) -> str:
    """Why ``entropy`` (the finite points) cannot support a slope, or ""."""
    if entropy.size < MIN_POINTS:
        return f"{entropy.size} point(s), need {MIN_POINTS}"
    span = float(entropy.max() - entropy.min())
    if span < MIN_ENTROPY_RANGE:
        return f"entropy range was {span:.3f} nats, below {MIN_ENTROPY_RANGE}"
    return ""


def steps_estimate(runs: Sequence, role: str) -> SlopeEstimate:
    """(a) Accept length against target entropy, one point per RL step, the runs pooled."""
    if not runs:
        return unavailable(STEPS_SOURCE, f"no {role} run")
    pairs = [(metric_column(r.metrics, "target_entropy"), metric_column(r.metrics, "spec/accept_length"))
             for r in runs]
    h = np.concatenate([x for x, _ in pairs])  # (S,)
    a = np.concatenate([y for _, y in pairs])  # (S,)
    keep = np.isfinite(h) & np.isfinite(a)
    reason = _check_spread(h[keep])
    if reason:
        return unavailable(STEPS_SOURCE, reason)
    interval, draws = bootstrap.steps_slope(pairs)
    span = (float(h[keep].min()), float(h[keep].max()))
    return SlopeEstimate(STEPS_SOURCE, interval, linear_fit(h, a).r, span, draws=draws)


def sweep_estimate(sweep: Sequence[Mapping], loss: str, method: str) -> SlopeEstimate:
    """(b) accept_length_{method} against target entropy across the temperatures of one head."""
    rows = [r for r in sweep if r.get("loss") == loss]
    if not rows:
        return unavailable(SWEEP_SOURCE, f"no sweep of the {loss} head")
    h = np.array([as_float(r.get("target_entropy")) for r in rows])  # (N,)
    a = np.array([as_float(r.get(f"accept_length_{method}")) for r in rows])  # (N,)
    keep = np.isfinite(h) & np.isfinite(a)
    reason = _check_spread(h[keep])
    if reason:
        return unavailable(SWEEP_SOURCE, reason)
    fit = linear_fit(h, a, bootstrap.CONFIDENCE)
    rng = np.random.default_rng(bootstrap.data_seed(np.array([fit.slope, fit.slope_stderr])))
    draws = fit.slope + fit.slope_stderr * rng.standard_t(fit.n - 2, bootstrap.NUM_RESAMPLES)  # parametric
    interval = Interval(fit.slope, fit.slope_ci, fit.n, "temperatures")
    return SlopeEstimate(SWEEP_SOURCE, interval, fit.r, (float(h[keep].min()), float(h[keep].max())), draws=draws)


def chain_weights(mean_alpha) -> np.ndarray:
    """d(accept length)/d(alpha_i) of 1 + sum_j prod_{k<=j} alpha_k at the given alphas, (..., K) -> (..., K).

    Example:
        >>> chain_weights([0.5, 0.5]).tolist()  # L = 1 + a1 + a1 a2: (1 + a2, a1)
        [1.5, 0.5]
    """
    a = np.asarray(mean_alpha, dtype=float)  # (..., K)
    weights = np.zeros_like(a)
    for j in range(a.shape[-1]):
        for i in range(j + 1):
            weights[..., i] += np.prod(np.delete(a[..., : j + 1], i, axis=-1), axis=-1)
    return weights


def chain_slope(sums: np.ndarray) -> np.ndarray:
    """Accept length per nat from per-depth sufficient statistics (..., K, 5) of (H, alpha) points."""
    slopes = bootstrap.slope_from_sums(sums)  # (..., K)
    return (chain_weights(bootstrap.mean_from_sums(sums)) * slopes).sum(-1)


def _token_points(runs: Sequence, method: str) -> tuple[np.ndarray, ...]:
    """Flat (depth, H, alpha, cluster id) over the runs' token statistics, and whether rows gave the clusters."""
    pos, h, a, cluster, by_row = [], [], [], [], True
    for i, run in enumerate(runs):
        for row in run.token_stats or []:
            n = len(row["position"])
            seq = row.get("row")
            by_row &= isinstance(seq, list) and len(seq) == n
            ids = seq if isinstance(seq, list) and len(seq) == n else [0] * n
            pos += [as_float(v) for v in row["position"]]
            h += [as_float(v) for v in row["entropy"]]
            a += [as_float(v) for v in row[f"alpha_{method}"]]
            cluster += [(i, as_float(row.get("step")), as_float(v)) for v in ids]
    return np.array(pos), np.array(h), np.array(a), cluster, by_row


def token_estimate(runs: Sequence, method: str) -> SlopeEstimate:
    """(c) Per-depth token-level fits of alpha_{method} on H, chained to accept length per nat."""
    pos, h, a, cluster, by_row = _token_points(runs, method)
    if pos.size == 0:
        return unavailable(TOKEN_SOURCE, "no token stats")
    keep = np.isfinite(pos) & np.isfinite(h) & np.isfinite(a)
    depths = sorted({int(j) for j in pos[keep]})
    if depths != list(range(1, len(depths) + 1)):
        return unavailable(TOKEN_SOURCE, f"draft depths {depths} are not 1..K")
    reason = _check_spread(h[keep])
    if reason:
        return unavailable(TOKEN_SOURCE, reason)
    _, ids = np.unique(np.array(cluster, dtype=float)[keep], axis=0, return_inverse=True)
    ids = ids.reshape(-1)
    num = int(ids.max()) + 1
    pos, h, a = pos[keep].astype(int), h[keep], a[keep]
    sums = np.stack([bootstrap.unit_sums(h[pos == j], a[pos == j], ids[pos == j], num) for j in depths], 1)  # (C, K, 5)
    unit = "sequences" if by_row else "RL steps (no completion ids)"
    interval, draws = bootstrap.over_sequences(sums, chain_slope, num_params=2 * len(depths), unit=unit)
    if not math.isfinite(interval.estimate):
        return unavailable(TOKEN_SOURCE, "a draft depth has too few points or no entropy spread")
    return SlopeEstimate(TOKEN_SOURCE, interval, linear_fit(h, a).r, (float(h.min()), float(h.max())), draws=draws)


def trend_estimate(runs: Sequence) -> tuple[Interval, np.ndarray]:
    """Accept length per RL step (its linear trend), the runs pooled, block bootstrap over steps."""
    pairs = [(metric_column(r.metrics, "step"), metric_column(r.metrics, "spec/accept_length")) for r in runs]
    return bootstrap.steps_slope(pairs)
