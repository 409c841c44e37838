"""Tests for bebop.analysis.bootstrap: interval coverage on synthetic data with a known slope, and the verdicts.

Coverage tests draw 200 synthetic datasets with a known slope and count how often the 95%
interval covers it; they pass for 180-198 covers (90-99%). False-alarm odds: the count is
Binomial(200, c) for the interval's true coverage c. Measured on 1000 further datasets of each
design (other seeds), c = 0.961 (RL steps) and c = 0.944 (sequences), giving P(count outside
180-198) = 0.32% and 0.45% (0.16% if c were exactly 0.95). Seeds are fixed, so a given
checkout passes or fails deterministically.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bebop.analysis import bootstrap
from bebop.analysis.bootstrap import (
    INCONCLUSIVE,
    NOT_REPRODUCED,
    REPRODUCED,
    Interval,
    decide,
    samples_to_decide,
)
from bebop.analysis.fit import linear_fit

NUM_DATASETS = 200
COVER_RANGE = (180, 198)  # 90-99% of NUM_DATASETS
TRUE_STEP_SLOPE = -1.5  # accept length per nat
TRUE_TOKEN_SLOPE = -0.3  # alpha per nat


def _steps(rng, num_steps=100, rho=0.5):
    """RL-step series: entropy falls over the run, accept length = 3 - 1.5 H + AR(1) noise (correlated steps)."""
    entropy = np.linspace(0.6, 0.3, num_steps) + 0.03 * rng.standard_normal(num_steps)
    noise = np.zeros(num_steps)
    noise[0] = rng.standard_normal()
    for t in range(1, num_steps):
        noise[t] = rho * noise[t - 1] + math.sqrt(1 - rho**2) * rng.standard_normal()
    return entropy, 3.0 + TRUE_STEP_SLOPE * entropy + 0.05 * noise


def _tokens(rng, num_sequences=60, per_sequence=20):
    """Token-level points clustered in sequences: a sequence shifts both its entropies and its acceptances."""
    seq = np.repeat(np.arange(num_sequences), per_sequence)
    shift_h, shift_a = rng.standard_normal(num_sequences), rng.standard_normal(num_sequences)
    entropy = np.clip(0.4 + 0.2 * shift_h[seq] + 0.1 * rng.standard_normal(seq.size), 0, None)
    accept = 0.9 + TRUE_TOKEN_SLOPE * entropy + 0.1 * shift_a[seq] + 0.05 * rng.standard_normal(seq.size)
    return entropy, accept, seq


def _covers(interval: Interval, value: float) -> bool:
    return interval.ci[0] <= value <= interval.ci[1]


def test_block_bootstrap_over_steps_covers_the_true_slope():
    rng = np.random.default_rng(2)
    covered = sum(_covers(bootstrap.steps_slope([_steps(rng)], seed=i)[0], TRUE_STEP_SLOPE)
                  for i in range(NUM_DATASETS))
    assert COVER_RANGE[0] <= covered <= COVER_RANGE[1], covered


def test_bootstrap_over_sequences_covers_the_true_slope_where_token_intervals_do_not():
    rng = np.random.default_rng(3)
    covered = naive = 0
    for i in range(NUM_DATASETS):
        entropy, accept, seq = _tokens(rng)
        covered += _covers(bootstrap.sequences_slope(entropy, accept, seq, seed=i), TRUE_TOKEN_SLOPE)
        lo, hi = linear_fit(entropy, accept).slope_ci  # tokens as independent points: the old interval
        naive += lo <= TRUE_TOKEN_SLOPE <= hi
    assert COVER_RANGE[0] <= covered <= COVER_RANGE[1], covered
    assert naive < 0.8 * NUM_DATASETS, naive  # about 40%: correlated tokens make it far too narrow


def test_pooled_runs_and_lines():
    rng = np.random.default_rng(4)
    runs = [_steps(rng, num_steps=40), _steps(rng, num_steps=25)]
    interval, draws = bootstrap.steps_slope(runs)
    assert interval.n == 65 and interval.unit == "RL steps" and draws.shape == (bootstrap.NUM_RESAMPLES,)
    assert interval.ci[0] < interval.estimate < interval.ci[1]
    grid = np.array([0.3, 0.45, 0.6])
    line, low, high = bootstrap.steps_line(runs, grid)
    np.testing.assert_allclose(line, interval.estimate * grid + (line[0] - interval.estimate * 0.3), rtol=1e-9)
    assert (low < line).all() and (line < high).all()
    again = bootstrap.steps_slope(runs)[0]
    assert again == interval  # a fixed seed: the same data give the same interval


def test_resampling_weights():
    rng = np.random.default_rng(0)
    w = bootstrap.step_weights([7, 30], 50, rng)  # (B, 37)
    assert w.shape == (50, 37)
    np.testing.assert_array_equal(w[:, :7].sum(1), 7)
    np.testing.assert_array_equal(w[:, 7:].sum(1), 30)
    c = bootstrap.cluster_weights(12, 50, rng)
    np.testing.assert_array_equal(c.sum(1), 12)
    assert bootstrap.block_length(30) == 5 and bootstrap.num_blocks(30) == 6 and bootstrap.block_length(1) == 1


def test_widen_by_hand():
    draws = np.array([0.0, 2.0])
    factor = 2.306004135 / 1.959963985 * math.sqrt(10 / 8)  # t_8(0.975) / z(0.975) * sqrt(u / (u - p))
    np.testing.assert_allclose(bootstrap.widen(1.0, draws, num_units=10, num_params=2), [1 - factor, 1 + factor])
    assert np.isnan(bootstrap.widen(1.0, draws, num_units=2, num_params=2)).all()


def test_too_little_data_gives_no_interval():
    interval, _ = bootstrap.steps_slope([(np.array([0.1, 0.2]), np.array([1.0, 2.0]))])
    assert math.isnan(interval.ci[0]) and interval.estimate == pytest.approx(10.0)
    assert decide(interval, 0.0, "below", "x").verdict == INCONCLUSIVE


def test_window_change_of_a_step_function():
    values = np.r_[np.full(10, 0.6), np.full(30, 0.4), np.full(10, 0.3)] + np.linspace(0, 1e-3, 50)
    start, end, change = bootstrap.window_change(values, 0.2)
    assert start == pytest.approx(0.6, abs=1e-3) and end == pytest.approx(0.3, abs=1e-3)
    assert change.ci[0] <= change.estimate <= change.ci[1] < -0.29 and change.n == 20


# --------------------------------------------------------------------------------------------
# Verdicts
# --------------------------------------------------------------------------------------------


def test_decide_gives_all_three_outcomes():
    below = Interval(-1.0, (-1.5, -0.5), 30, "RL steps")
    assert decide(below, 0.0, "below", "the slope").verdict == REPRODUCED
    assert decide(below, 0.0, "above", "the slope").verdict == NOT_REPRODUCED
    straddle = Interval(-0.2, (-0.6, 0.2), 30, "RL steps")
    d = decide(straddle, 0.0, "below", "the slope")
    assert d.verdict == INCONCLUSIVE and d.more_units == pytest.approx(4.0)  # half-width 0.4 vs distance 0.2
    assert "contains 0" in d.note and "toward the claim" in d.note
    d = decide(Interval(1.0, (-1.0, 3.0), 30, "RL steps"), 0.0, "below", "the slope")
    assert d.verdict == INCONCLUSIVE and d.more_units == pytest.approx(4.0)
    assert "about 4.0× the RL steps (30 → 120)" in d.note and "toward its negation" in d.note
    on = decide(Interval(0.0, (-1.0, 1.0), 30, "RL steps"), 0.0, "below", "the slope")
    assert on.verdict == INCONCLUSIVE and "no sample size" in on.note
    with pytest.raises(ValueError, match="claim"):
        decide(below, 0.0, "under", "x")


def test_samples_to_decide_uses_the_half_width_facing_the_threshold():
    skewed = Interval(1.0, (0.5, 4.0), 100, "sequences")  # lower half-width 0.5, upper 3.0
    assert samples_to_decide(skewed, 0.25) == pytest.approx((0.5 / 0.75) ** 2)
    assert samples_to_decide(skewed, 3.0) == pytest.approx((3.0 / 2.0) ** 2)
    assert math.isnan(samples_to_decide(Interval(1.0, (math.nan, math.nan), 3, "RL steps"), 0.0))
