"""Tests for the batch's tail in --mode auto's prediction (bebop.speculative.auto.tail).

What pins it, on synthetic numbers (no model): the remaining-length draws, the steps per row, a
call's tokens/s by hand (lockstep: the longest row sets the steps) and against simulated
calls. The chooser's use of it is in test_chooser.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from bebop.speculative.auto import tail
from tests.speculative.auto.helpers import known_rows


def _finish_steps(rows: tail.Rows, alphas) -> list[int]:
    """Per group, the step after which its rows are finished, where that step is certain (alphas 0 or 1)."""
    done_by = tail.finished(rows, [alphas])[0]  # (G, T + 1)
    assert np.isin(done_by.round(12), (0.0, 1.0)).all()  # no randomness
    return [int(np.argmax(f > 0.5)) for f in done_by]


def test_remaining_lengths_follow_the_history_longer_than_each_row():
    lengths = tail.Lengths()
    lengths.add([5, 10])
    rows = lengths.rows([0, 6, 12, 0], max_new=20)
    assert rows.done.tolist() == [0, 6, 12] and rows.count.tolist() == [2, 1, 1]
    assert rows.left[0, 5] == rows.left[0, 10] == 0.5 and rows.left[0].sum() == 1  # both seen lengths
    assert rows.left[1, 4] == 1 and rows.left[2, 8] == 1  # only 10 > 6; none > 12: the cap 20
    assert rows.tokens() == pytest.approx(2 * 7.5 + 4 + 8)
    nothing = tail.Lengths().rows([3, 5], 20)
    assert nothing.left[0, 17] == nothing.left[1, 15] == 1
    known = known_rows([0, 0, 3], [4, 4, 0])  # a row with nothing left counts one token
    assert known.done.tolist() == [0, 3] and known.count.tolist() == [2, 1] and known.left[1, 1] == 1


def test_steps_per_row_by_hand():
    rows = known_rows([0, 0], [7, 1])
    assert _finish_steps(rows, []) == [1, 7]  # plain: a token a step (groups sorted by tokens left)
    assert _finish_steps(rows, [1.0, 1.0]) == [1, 3]  # 3 tokens a step
    assert _finish_steps(rows, [0.0, 0.0]) == [1, 7]


def test_steps_by_offset_bucket_by_hand():
    """Alphas per offset bucket: a step draws from the bucket of the tokens its row emitted before it."""
    assert tail.OFFSET_EDGES == (4, 8)
    never, always = [0.0, 0.0], [1.0, 1.0]
    rows = known_rows([0, 6, 8], [20, 3, 20])
    assert _finish_steps(rows, [never, never, always]) == [8 + 4, 3, 7]  # 8 singles, 12 at 3 a step; 6, 7, 8; 20 / 3
    assert _finish_steps(known_rows([0, 0], [20, 3]), [always, never, always]) == [1, 2 + 2 + 4]  # 0-2, 3-5; 6, 7
    assert _finish_steps(rows, [always] * 3) == _finish_steps(rows, always)  # past the last edge: one chain for all


def test_finished_matches_a_simulation():
    """The chain's P(finished after t steps) against 20,000 simulated rows of three groups (two starting
    in the opener, one past it), random alphas per bucket, remaining lengths from a history: a
    chi-square test per group over the steps each row took, false alarm 1e-4 each."""
    rng = np.random.default_rng(0)
    alphas = rng.uniform(0.2, 0.95, (3, 3)).tolist()  # (bucket, depth)
    lengths = tail.Lengths()
    lengths.add(rng.integers(2, 30, 40).tolist())
    rows = lengths.rows([0, 5, 11], max_new=30)
    done_by = tail.finished(rows, [alphas])[0]  # (G, T + 1)
    thresholds = np.cumprod(alphas, 1)  # (bucket, depth) P(L >= j)
    seen = np.minimum(np.array(lengths.seen), 30)
    n = 20_000
    for g, start in enumerate(rows.done.tolist()):
        left = rng.choice(seen[seen > start], n) - start
        offset, steps = np.full(n, start), np.zeros(n, dtype=int)
        while (active := offset < start + left).any():
            bucket = np.searchsorted(tail.OFFSET_EDGES, offset, side="right")
            accepted = (rng.random(n)[:, None] < thresholds[bucket]).sum(1)
            offset, steps = offset + active * (1 + accepted), steps + active
        expected = np.diff(done_by[g]) * n  # rows finishing at step t = 1..T
        observed = np.bincount(steps, minlength=len(done_by[g]))[1:]
        keep = expected >= 5
        counts = np.append(observed[keep], observed[~keep].sum())
        means = np.append(expected[keep], expected[~keep].sum())
        chi2 = ((counts - means) ** 2 / np.maximum(means, 1e-9)).sum()
        assert chi2 < stats.chi2.ppf(1 - 1e-4, len(counts) - 1), (g, chi2)


def test_all_settings_priced_at_once_as_one_by_one():
    """``call_rates`` pads every setting to the deepest K: each setting's rate is the one it gets alone,
    and equal settings get equal rates."""
    rows, base = known_rows([0, 0], [2, 10]), 0.001
    settings = [[], [1.0, 1.0], [0.0], [[1.0], [0.0], [1.0]], [1.0, 1.0], [0.5, 0.7, 0.2]]
    together = tail.call_rates(rows, settings, np.full(len(settings), base))
    alone = [tail.call_rates(rows, [a], np.array([base]))[0] for a in settings]
    assert together == pytest.approx(alone)
    assert together[0] == pytest.approx(1200) and together[1] == pytest.approx(12 / 0.004)  # 10 steps; 4 at 3 a step
    assert together[1] == together[4] and together[2] == together[0]  # alpha 0: one token a step, as plain


def test_call_rate_prices_the_lockstep_tail_by_hand():
    """The module's example: rows with 2 and 10 tokens left take 10 plain steps."""
    rows = known_rows([0, 0], [2, 10])
    assert tail.call_rates(rows, [[]], np.array([0.001]))[0] == pytest.approx(1200)


def test_a_chain_cut_to_the_longest_remaining_row_prices_the_same():
    """``finished`` runs its chain only as far as any row can still emit: rows whose remaining-token
    table is padded with empty columns (a history of short completions under a large max_new_tokens)
    price exactly as the same rows without the padding, at every setting."""
    lengths = tail.Lengths()
    lengths.add([6, 9, 12, 12, 15])
    rows = lengths.rows([1, 1, 4, 9], max_new=200)
    assert rows.left.shape[1] == 201 and not rows.left[:, 15:].any()
    short = tail.Rows(rows.done, rows.count, rows.left[:, :15])
    settings = [[], [0.9, 0.5], [[0.4, 0.9], [0.7, 0.6], [0.95, 0.8]]]
    base = np.array([0.001, 0.002, 0.003])
    assert tail.call_rates(rows, settings, base) == pytest.approx(tail.call_rates(short, settings, base), rel=1e-12)
    done_by = tail.finished(rows, settings)
    assert done_by.shape == tail.finished(short, settings).shape == (3, 3, 15)  # the same chain: t = 0..14
    assert done_by[..., -1] == pytest.approx(1.0) and not done_by[..., 0].any()  # 14 tokens at most: all done by step 14


def test_rows_past_the_opener_price_as_a_chain_from_zero():
    """The chain starts at the lowest start, not at 0: rows that have emitted 6 and 11 tokens finish as
    they do beside a row at 0 (which adds states 0-5 and its own chain), at every step."""
    settings = [[], [0.9, 0.5], [[0.4, 0.9], [0.7, 0.6], [0.95, 0.8]]]
    late = known_rows([6, 11], [9, 5])
    with_early = known_rows([0, 6, 11], [2, 9, 5])
    np.testing.assert_allclose(tail.finished(late, settings),
                               tail.finished(with_early, settings)[:, 1:, :10], rtol=0, atol=1e-12)


def test_call_rate_matches_a_simulated_lockstep_call():
    """Expected tokens / expected seconds of whole lockstep calls (4 rows, two in the opener, history
    lengths), 20,000 simulated, within 4.4 standard errors (false alarm ~1e-5)."""
    rng = np.random.default_rng(1)
    alphas = [[0.5, 0.6, 0.7], [0.8, 0.7, 0.6], [0.9, 0.8, 0.5]]
    lengths = tail.Lengths()
    lengths.add(rng.integers(3, 40, 50).tolist())
    done = [0, 0, 5, 9]
    rows = lengths.rows(done, max_new=40)
    exact = tail.call_rates(rows, [alphas], np.array([0.01]))[0]
    seen, thresholds, n = np.minimum(np.array(lengths.seen), 40), np.cumprod(alphas, 1), 20_000
    offset = np.array(done)[None].repeat(n, 0)  # (calls, rows)
    end = np.stack([rng.choice(seen[seen > d], n) for d in done], 1)
    tokens, seconds = (end - offset).sum(1), np.zeros(n)
    while (active := offset < end).any():
        bucket = np.searchsorted(tail.OFFSET_EDGES, offset, side="right")
        accepted = (rng.random(offset.shape)[..., None] < thresholds[bucket]).sum(-1)
        seconds += np.where(active.any(1), 0.01, 0.0)
        offset = offset + active * (1 + accepted)
    rate = tokens.mean() / seconds.mean()
    # delta method: sd of mean(tokens) / mean(seconds)
    se = rate * np.sqrt(np.var(tokens / tokens.mean() - seconds / seconds.mean()) / n)
    assert abs(exact - rate) < 4.4 * se, (exact, rate, se)
