"""Reduces one RL run to the numbers a report shows (``summarize_run``).

Conventions:

1. "start" and "end" values are means over the first and last ``WINDOW_FRAC`` of the steps
   (at least one step each), so one noisy step does not decide them. The entropy change between
   them has a 95% interval from a block bootstrap within each window.
2. A metric that is absent or null on a step counts as NaN and is left out of means and fits.
3. Step times (step, rollout, train, MTP) leave out a run's first ``WARMUP_STEPS`` steps when it has
   more: the first step carries one-time costs (allocations, lazy initialisation) that are not speed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bebop.analysis import bootstrap
from bebop.analysis.bootstrap import Interval
from bebop.analysis.fit import entropy_mismatch_split, rs_vs_to
from bebop.analysis.runs import Run, as_float, metric_column
from bebop.analysis.slopes import steps_estimate
from bebop.utils.run_files import TOKEN_ROW_KEY, TOKEN_STATS_KEYS

WARMUP_STEPS = 1  # first steps of a run left out of its mean step times (one-time costs)
WINDOW_FRAC = 0.2  # share of the steps averaged for "start" and "end" values


def per_position(metrics: Sequence[Mapping], key: str) -> np.ndarray:
    """A per-position list metric over steps, shape (S, K), NaN where absent; K = longest list."""
    rows = [row.get(key) if isinstance(row.get(key), list) else [] for row in metrics]
    num_pos = max((len(r) for r in rows), default=0)
    out = np.full((len(rows), num_pos), math.nan)  # (S, K)
    for i, r in enumerate(rows):
        out[i, : len(r)] = [as_float(v) for v in r]
    return out


def _nanmean(values: np.ndarray, axis: int | None = None) -> Any:
    """Mean of the finite entries (NaN when there are none), without numpy's empty-slice warning."""
    values = np.asarray(values, dtype=float)
    finite = np.isfinite(values)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(finite, values, 0.0).sum(axis=axis) / finite.sum(axis=axis)


def _window(values: np.ndarray, end: bool) -> np.ndarray:
    """The first (or last) WINDOW_FRAC of the rows of ``values``, at least one row."""
    size = max(1, int(len(values) * WINDOW_FRAC))
    return values[-size:] if end else values[:size]


def _mismatch_summary(entropy: np.ndarray, accept: np.ndarray) -> dict:
    """Eq. 16 on accept length: early slope and the end-window entropy and mismatch parts."""
    keep = np.isfinite(entropy) & np.isfinite(accept)
    if keep.sum() < 3:
        return dict.fromkeys(("early_slope", "delta_accept_end", "entropy_part_end", "mismatch_part_end"), math.nan)
    split = entropy_mismatch_split(entropy[keep], accept[keep])
    return {
        "early_slope": split["slope"],
        "delta_accept_end": float(_nanmean(_window(split["delta_alpha"], end=True))),
        "entropy_part_end": float(_nanmean(_window(split["entropy_part"], end=True))),
        "mismatch_part_end": float(_nanmean(_window(split["mismatch_part"], end=True))),
    }


def _sequence_ids(token_stats: Sequence[Mapping]) -> np.ndarray:  # (N,)
    """One id per (RL step, completion) of the flattened positions; a whole step without ``row`` lists."""
    pairs = [(i, as_float(r)) for i, row in enumerate(token_stats)
             for r in (row.get(TOKEN_ROW_KEY) or [0] * len(row["position"]))]
    return np.unique(np.array(pairs, dtype=float).reshape(-1, 2), axis=0, return_inverse=True)[1].reshape(-1)


def _token_summary(token_stats: Sequence[Mapping] | None) -> dict | None:
    """Token-level slopes of alpha against entropy (bootstrap over completions) and the RS-vs-TO shares (Eq. 48)."""
    if not token_stats:
        return None
    flat = {k: np.array([as_float(v) for row in token_stats for v in row[k]], dtype=float) for k in TOKEN_STATS_KEYS}
    if flat["entropy"].size == 0:
        return None
    ids = _sequence_ids(token_stats)
    return {
        "num_positions": int(flat["entropy"].size),
        "alpha_rs_slope": bootstrap.sequences_slope(flat["entropy"], flat["alpha_rs"], ids),
        "alpha_to_slope": bootstrap.sequences_slope(flat["entropy"], flat["alpha_to"], ids),
        **rs_vs_to(flat["alpha_rs"], flat["alpha_to"]),
    }


def summarize_run(run: Run) -> dict:
    """Reduces a run to the numbers the report shows.

    Args:
        run: A loaded run.

    Returns:
        dict with ``label``, ``mode``, ``mtp_loss``, ``mtp_update``, ``online_loss``,
        ``num_steps``; mean seconds ``step_s``, ``rollout_s``, ``train_s``, ``mtp_s``;
        ``accept_length_start``/``_end``, ``accuracy_start``/``final_accuracy`` and
        ``entropy_start``/``_end`` (window means, see the module docstring) with ``accuracy_change``
        and ``entropy_change`` (Intervals of end - start); ``mean_target_entropy`` (nats);
        ``entropy_slope`` (Interval of the accept-length slope against entropy over steps, block
        bootstrap; NaN with ``entropy_slope_reason`` when the steps are too few or their entropies too
        close, ``slopes.steps_estimate``) and ``entropy_r``;
        per-position lists ``alpha_rs_start``/``_end``, ``alpha_to_start``/``_end``,
        ``accepted_per_pos_start``/``_end``; the Eq. 16 split (``early_slope``,
        ``delta_accept_end``, ``entropy_part_end``, ``mismatch_part_end``); and ``token``
        (token-level slopes and RS-vs-TO shares, or None without token stats). Values that cannot
        be computed are NaN.
    """
    m, cfg = run.metrics, run.config
    entropy = metric_column(m, "target_entropy")  # (S,)
    accept = metric_column(m, "spec/accept_length")  # (S,)
    accuracy = metric_column(m, "accuracy")  # (S,)
    slope = steps_estimate([run], run.label)
    entropy_start, entropy_end, entropy_change = bootstrap.window_change(entropy, WINDOW_FRAC)
    accuracy_start, accuracy_end, accuracy_change = bootstrap.window_change(accuracy, WINDOW_FRAC)
    summary = {
        "label": run.label,
        "mode": str(cfg.get("mode") or (m[0].get("mode") if m else None) or "none"),
        "mtp_loss": cfg.get("mtp_loss"),
        "mtp_update": cfg.get("mtp_update"),
        "online_loss": cfg.get("online_loss"),
        "num_steps": len(m),
        **{key: float(_nanmean(timed_column(run, key))) for key in ("step_s", "rollout_s", "train_s", "mtp_s")},
        "accept_length_start": float(_nanmean(_window(accept, end=False))),
        "accept_length_end": float(_nanmean(_window(accept, end=True))),
        "accuracy_start": accuracy_start,
        "final_accuracy": accuracy_end,
        "accuracy_change": accuracy_change,
        "entropy_start": entropy_start,
        "entropy_end": entropy_end,
        "entropy_change": entropy_change,
        "mean_target_entropy": float(_nanmean(entropy)),
        "entropy_slope": slope.interval,
        "entropy_r": slope.r,
        "entropy_slope_reason": slope.reason,
    }
    for key in ("alpha_rs", "alpha_to", "accepted_per_pos"):
        values = per_position(m, f"spec/{key}")  # (S, K)
        summary[f"{key}_start"] = [float(v) for v in _nanmean(_window(values, end=False), axis=0)]
        summary[f"{key}_end"] = [float(v) for v in _nanmean(_window(values, end=True), axis=0)]
    summary.update(_mismatch_summary(entropy, accept))
    summary["token"] = _token_summary(run.token_stats)
    return summary


def timed_column(run: Run, key: str) -> np.ndarray:  # (S',)
    """A step-time metric of a run without its warm-up steps (module docstring, item 3)."""
    timed = run.metrics[WARMUP_STEPS:] if len(run.metrics) > WARMUP_STEPS else run.metrics
    return metric_column(timed, key)


def mean_step_time(runs: Sequence[Run]) -> tuple[Interval, np.ndarray]:
    """Mean seconds per step over the runs' steps (pooled, warm-up steps left out), with a block bootstrap over
    RL steps; returns (interval, draws (B,)), NaN without any logged ``step_s``."""
    times = [timed_column(r, "step_s") for r in runs]  # (S',) per run
    if not np.isfinite(np.concatenate(times or [np.zeros(0)])).any():
        return Interval(math.nan, (math.nan, math.nan), 0, "RL steps"), np.full(bootstrap.NUM_RESAMPLES, math.nan)
    return bootstrap.steps_mean(times)


def step_speedup(base: Sequence[Run], runs: Sequence[Run]) -> tuple[Interval, Interval, Interval]:
    """How much faster the steps of ``runs`` are than those of ``base`` (runs of one role each, pooled).

    The speed-up is (mean step time of ``base``) / (mean step time of ``runs``), warm-up steps left
    out; its interval combines the two block bootstraps over RL steps (independent draws, so their
    ratio is a draw of the ratio).

    Returns:
        (speed-up, mean seconds per step of ``base``, mean seconds per step of ``runs``); estimates
        are NaN where the runs logged no ``step_s``.
    """
    (base_mean, base_draws), (mean, draws) = mean_step_time(base), mean_step_time(runs)
    with np.errstate(invalid="ignore", divide="ignore"):
        estimate = base_mean.estimate / mean.estimate if mean.estimate > 0 else math.nan
        ratio = bootstrap.percentile_interval(estimate, base_draws / draws, base_mean.n + mean.n, "RL steps")
    return ratio, base_mean, mean


def describe_speedup(ratio: Interval) -> str:
    """A speed-up with its interval, or says it has none.

    Example: Interval(1.2, (1.1, 1.3), 40, "RL steps") -> "1.20× [1.10, 1.30]".
    """
    low, high = ratio.ci
    if not math.isfinite(ratio.estimate):
        return "–"
    interval = f"[{low:.2f}, {high:.2f}]" if math.isfinite(low) and math.isfinite(high) else "(no interval)"
    return f"{ratio.estimate:.2f}× {interval}"


def rollout_share(runs: Sequence[Run]) -> float:
    """The share of the step time the rollout takes, over the steps of ``runs`` that logged both (warm-up steps
    left out); NaN without such steps."""
    rollout = np.concatenate([timed_column(r, "rollout_s") for r in runs] or [np.zeros(0)])  # (S',)
    step = np.concatenate([timed_column(r, "step_s") for r in runs] or [np.zeros(0)])  # (S',)
    keep = np.isfinite(rollout) & np.isfinite(step)
    return float(rollout[keep].sum() / step[keep].sum()) if keep.any() and step[keep].sum() > 0 else math.nan
