"""Tests for bebop.analysis.fit: t quantiles and OLS against scipy, the paper's rules by hand."""

import math

import numpy as np
import pytest
from scipy import special, stats

from bebop.analysis.fit import (
    bucketed_fit,
    entropy_mismatch_split,
    expected_accept_length,
    linear_fit,
    regularized_incomplete_beta,
    rs_vs_to,
    student_t_quantile,
)


@pytest.mark.parametrize("dof", [1, 2, 3, 4.5, 7, 30, 250, 1e4])
def test_student_t_quantile_matches_scipy(dof):
    for prob in [1e-10, 1e-4, 0.025, 0.3, 0.4999, 0.5001, 0.8, 0.975, 0.995, 1 - 1e-8]:
        expected = stats.t.ppf(prob, dof)
        assert student_t_quantile(prob, dof) == pytest.approx(expected, rel=1e-6)
    assert student_t_quantile(0.5, dof) == 0.0


def test_student_t_quantile_rejects_bad_arguments():
    with pytest.raises(ValueError, match="prob"):
        student_t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="dof"):
        student_t_quantile(0.9, 0)


def test_regularized_incomplete_beta_matches_scipy():
    for a, b, x in [(0.5, 0.5, 0.3), (3.0, 0.5, 0.9), (50.0, 0.5, 0.99), (2.0, 7.0, 0.1), (1.0, 1.0, 0.25)]:
        assert regularized_incomplete_beta(a, b, x) == pytest.approx(special.betainc(a, b, x), rel=1e-12, abs=1e-15)
    assert regularized_incomplete_beta(2.0, 3.0, 0.0) == 0.0
    assert regularized_incomplete_beta(2.0, 3.0, 1.0) == 1.0


@pytest.mark.parametrize("n", [3, 8, 200])
def test_linear_fit_matches_linregress(n):
    rng = np.random.default_rng(n)
    x = rng.uniform(0.1, 0.6, n)
    y = 3.0 - 1.5 * x + rng.normal(0, 0.05, n)
    fit = linear_fit(x, y, confidence=0.9)
    ref = stats.linregress(x, y)
    t = stats.t.ppf(0.95, n - 2)
    assert fit.n == n and fit.confidence == 0.9
    assert fit.slope == pytest.approx(ref.slope, rel=1e-10)
    assert fit.intercept == pytest.approx(ref.intercept, rel=1e-10)
    assert fit.r == pytest.approx(ref.rvalue, rel=1e-10)
    assert fit.slope_stderr == pytest.approx(ref.stderr, rel=1e-10)
    assert fit.intercept_stderr == pytest.approx(ref.intercept_stderr, rel=1e-10)
    half_slope, half_intercept = t * ref.stderr, t * ref.intercept_stderr
    np.testing.assert_allclose(fit.slope_ci, [ref.slope - half_slope, ref.slope + half_slope], rtol=1e-8)
    intercept_ci = [ref.intercept - half_intercept, ref.intercept + half_intercept]
    np.testing.assert_allclose(fit.intercept_ci, intercept_ci, rtol=1e-8)
    np.testing.assert_allclose(fit.predict([0.0, 1.0]), [fit.intercept, fit.intercept + fit.slope])


def test_linear_fit_degenerate_inputs_give_nan_not_errors():
    for x, y in [([], []), ([1.0], [2.0]), ([1.0, 1.0, 1.0], [1.0, 2.0, 3.0])]:
        fit = linear_fit(x, y)
        assert math.isnan(fit.slope) and math.isnan(fit.intercept) and math.isnan(fit.r)
        assert all(math.isnan(v) for v in fit.slope_ci + fit.intercept_ci)
    two = linear_fit([0.0, 2.0], [1.0, 5.0])
    assert (two.slope, two.intercept, two.r) == (2.0, 1.0, 1.0)
    assert math.isnan(two.slope_ci[0]) and math.isnan(two.slope_stderr)
    flat = linear_fit([0.0, 1.0, 2.0], [4.0, 4.0, 4.0])
    assert flat.slope == 0.0 and math.isnan(flat.r) and flat.slope_ci == (0.0, 0.0)


def test_linear_fit_drops_non_finite_pairs():
    fit = linear_fit([0.0, 1.0, np.nan, 2.0, 3.0], [1.0, 3.0, 100.0, 5.0, None])
    assert fit.n == 3
    assert fit.slope == pytest.approx(2.0) and fit.intercept == pytest.approx(1.0)


def test_linear_fit_rejects_bad_arguments():
    with pytest.raises(ValueError, match="same length"):
        linear_fit([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="confidence"):
        linear_fit([1, 2, 3], [1, 2, 3], confidence=1.0)


def test_bucketed_fit_recovers_slope_and_buckets_by_quantile():
    rng = np.random.default_rng(0)
    entropy = rng.exponential(0.4, 5000)  # (N,) skewed like token entropies
    accept = 0.95 - 0.3 * entropy + rng.normal(0, 0.05, entropy.size)
    out = bucketed_fit(entropy, accept, num_buckets=10, min_count=20)
    lo, hi = out.fit.slope_ci
    assert lo <= -0.3 <= hi
    assert out.fit.n == entropy.size
    assert len(out.centers) == 10 and out.counts.sum() == entropy.size
    assert np.all(np.diff(out.centers) > 0)
    np.testing.assert_allclose(out.means, 0.95 - 0.3 * out.centers, atol=0.01)


def test_bucketed_fit_drops_sparse_buckets():
    out = bucketed_fit(np.linspace(0, 1, 50), np.linspace(1, 0, 50), num_buckets=5, min_count=11)
    assert len(out.centers) == 0
    out = bucketed_fit(np.linspace(0, 1, 50), np.linspace(1, 0, 50), num_buckets=5, min_count=10)
    assert out.counts.tolist() == [10, 10, 10, 10, 10]
    assert out.fit.slope == pytest.approx(-1.0)


def test_bucketed_fit_empty_input():
    out = bucketed_fit([], [])
    assert out.centers.size == 0 and out.fit.n == 0


def test_entropy_mismatch_split_pure_entropy_has_zero_mismatch():
    entropy = 0.3 + 0.2 * np.sin(np.linspace(0, 3, 40))  # (S,)
    alpha = 0.8 - 0.5 * (entropy - entropy[0])
    out = entropy_mismatch_split(entropy, alpha, early_frac=0.3)
    assert out["num_early"] == 12
    assert out["slope"] == pytest.approx(-0.5)
    np.testing.assert_allclose(out["mismatch_part"], 0.0, atol=1e-12)
    np.testing.assert_allclose(out["entropy_part"], out["delta_alpha"], atol=1e-12)
    assert out["entropy0"] == entropy[0] and out["alpha0"] == alpha[0]


def test_entropy_mismatch_split_isolates_late_drift():
    entropy = np.linspace(0.2, 0.6, 30)
    drift = np.where(np.arange(30) >= 15, -0.01 * (np.arange(30) - 15), 0.0)  # starts after the early window
    alpha = 0.9 - 0.4 * entropy + drift
    out = entropy_mismatch_split(entropy, alpha)
    assert out["slope"] == pytest.approx(-0.4)
    np.testing.assert_allclose(out["mismatch_part"], drift, atol=1e-12)


def test_entropy_mismatch_split_uses_at_least_three_early_steps():
    out = entropy_mismatch_split([0.1, 0.2, 0.3, 0.4], [1.0, 0.9, 0.8, 0.5], early_frac=0.1)
    assert out["num_early"] == 3 and out["slope"] == pytest.approx(-1.0)
    with pytest.raises(ValueError):
        entropy_mismatch_split([0.1, 0.2], [1.0])


def _alphas(p, q):
    """Literal alpha_RS = sum min(p, q) and alpha_TO = p(argmax q)."""
    p, q = np.asarray(p), np.asarray(q)
    return float(np.minimum(p, q).sum()), float(p[np.argmax(q)])


def test_rs_vs_to_literal_cases():
    rs_win = _alphas([0.5, 0.3, 0.2], [0.2, 0.5, 0.3])  # 0.7 vs p(1) = 0.3
    to_win = _alphas([0.9, 0.05, 0.05], [0.4, 0.3, 0.3])  # 0.5 vs 0.9
    tie = _alphas([0.9, 0.1], [1.0, 0.0])  # 0.9 vs 0.9
    assert rs_win == pytest.approx((0.7, 0.3)) and to_win == pytest.approx((0.5, 0.9))
    # Eq. 48: RS wins exactly when TV(p, q) < 1 - p(argmax q).
    assert (1 - rs_win[0]) < 1 - rs_win[1] and not (1 - to_win[0]) < 1 - to_win[1]
    out = rs_vs_to([rs_win[0], to_win[0], tie[0], rs_win[0]], [rs_win[1], to_win[1], tie[1], rs_win[1]])
    assert out == {"share_rs_wins": 0.5, "share_to_wins": 0.25, "share_tie": 0.25, "n": 4}
    empty = rs_vs_to([], [])
    assert empty["n"] == 0 and math.isnan(empty["share_rs_wins"])


def test_expected_accept_length_literal_cases():
    assert expected_accept_length([0.5, 0.5]) == pytest.approx(1.75)
    assert expected_accept_length([0.9, 0.8, 0.5]) == pytest.approx(1 + 0.9 + 0.72 + 0.36)
    assert expected_accept_length([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]]) == pytest.approx(2.5)
    with pytest.raises(ValueError):
        expected_accept_length(np.ones((2, 2, 2)))
