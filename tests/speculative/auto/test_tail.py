"""Tests for the batch's tail in --mode auto's prediction (bebop.speculative.auto.tail).

What pins it, on synthetic numbers (no model): the remaining-length draws, the steps per row, a
call's tokens/s by hand (lockstep: the longest row sets the steps; the step cost follows the active
rows; the prefill), a case where pricing the tail changes the best choice, the row-count slope of the
step cost, the first step priced as prefill, and what a call leaves to the chooser.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from bebop.speculative.auto import chooser as auto, tail
from bebop.speculative.auto.chooser import AutoChooser, StepCosts
from bebop.speculative.completions import Completions
from tests.speculative.auto.test_chooser import _acceptance


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
    known = tail.Rows.known([0, 0, 3], [4, 4, 0])  # a row with nothing left counts one token
    assert known.done.tolist() == [0, 3] and known.count.tolist() == [2, 1] and known.left[1, 1] == 1


def test_a_fresh_calls_rows_may_end_with_the_prefill():
    """Before a call, a row has not yet emitted its prefill token, so a completion of one token (EOS
    first) is a row that runs no decode step, not a row known to be longer. History [1, 3], two plain
    rows at 1 ms a step: each has 0 or 2 tokens left (1/2 each), so 2 tokens are expected over
    1.5 steps (none when both end: 1/4), 1,333 tok/s; rows still decoding at offset 1 have 2 left."""
    lengths = tail.Lengths()
    lengths.add([1, 3])
    fresh = lengths.fresh(2, 1, max_new=10)
    assert fresh.done.tolist() == [1] and fresh.count.tolist() == [2]
    assert fresh.left[0, 0] == fresh.left[0, 2] == 0.5 and fresh.tokens() == pytest.approx(2.0)
    assert tail.call_rates(fresh, [[]], np.array([0.001]))[0] == pytest.approx(2 / 0.0015)
    decoding = lengths.rows([1, 1], max_new=10)
    assert decoding.left[0, 2] == 1 and tail.call_rates(decoding, [[]], np.array([0.001]))[0] == pytest.approx(2000)
    assert tail.Lengths().fresh(3, 1, max_new=10).left[0, 9] == 1  # nothing seen: the cap
    chooser = AutoChooser()
    chooser.costs = StepCosts(seconds={0: 0.001})
    chooser.lengths = lengths
    assert chooser.predict_call("none", 0, 2, 10) == pytest.approx((2 + 2) / 0.0015)  # the prefill's 2 tokens too


def test_steps_per_row_by_hand():
    rows = tail.Rows.known([0, 0], [7, 1])
    assert _finish_steps(rows, []) == [1, 7]  # plain: a token a step (groups sorted by tokens left)
    assert _finish_steps(rows, [1.0, 1.0]) == [1, 3]  # 3 tokens a step
    assert _finish_steps(rows, [0.0, 0.0]) == [1, 7]


def test_steps_by_offset_bucket_by_hand():
    """Alphas per offset bucket: a step draws from the bucket of the tokens its row emitted before it."""
    assert tail.OFFSET_EDGES == (4, 8)
    never, always = [0.0, 0.0], [1.0, 1.0]
    rows = tail.Rows.known([0, 6, 8], [20, 3, 20])
    assert _finish_steps(rows, [never, never, always]) == [8 + 4, 3, 7]  # 8 singles, 12 at 3 a step; 6, 7, 8; 20 / 3
    assert _finish_steps(tail.Rows.known([0, 0], [20, 3]), [always, never, always]) == [1, 2 + 2 + 4]  # 0-2, 3-5; 6, 7
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
    rows, base = tail.Rows.known([0, 0], [2, 10]), 0.001
    settings = [[], [1.0, 1.0], [0.0], [[1.0], [0.0], [1.0]], [1.0, 1.0], [0.5, 0.7, 0.2]]
    together = tail.call_rates(rows, settings, np.full(len(settings), base))
    alone = [tail.call_rates(rows, [a], np.array([base]))[0] for a in settings]
    assert together == pytest.approx(alone)
    assert together[0] == pytest.approx(1200) and together[1] == pytest.approx(12 / 0.004)  # 10 steps; 4 at 3 a step
    assert together[1] == together[4] and together[2] == together[0]  # alpha 0: one token a step, as plain


def test_call_rate_prices_the_lockstep_tail_by_hand():
    """The module's example: rows with 2 and 10 tokens left take 10 plain steps."""
    rows = tail.Rows.known([0, 0], [2, 10])
    assert tail.call_rates(rows, [[]], np.array([0.001]))[0] == pytest.approx(1200)
    # 1 ms x (1 + active rows): 2 steps at 2 rows (3 ms), 8 at 1 (2 ms) -> 12 tokens / 22 ms; plus 3 ms prefill
    assert tail.call_rates(rows, [[]], np.array([0.001]), row_slope=1.0)[0] == pytest.approx(12 / 0.022)
    assert tail.call_rates(rows, [[]], np.array([0.001]), row_slope=1.0, prefill_s=0.003)[0] == pytest.approx(12 / 0.025)


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
    base, slope = np.array([0.001, 0.002, 0.003]), np.array([0.01, 0.02, 0.03])
    assert tail.call_rates(rows, settings, base, slope, 0.004) == pytest.approx(
        tail.call_rates(short, settings, base, slope, 0.004), rel=1e-12)
    done_by = tail.finished(rows, settings)
    assert done_by.shape == tail.finished(short, settings).shape == (3, 3, 15)  # the same chain: t = 0..14
    assert done_by[..., -1] == pytest.approx(1.0) and not done_by[..., 0].any()  # 14 tokens at most: all done by step 14


def test_rows_past_the_opener_price_as_a_chain_from_zero():
    """The chain starts at the lowest start, not at 0: rows that have emitted 6 and 11 tokens finish as
    they do beside a row at 0 (which adds states 0-5 and its own chain), at every step."""
    settings = [[], [0.9, 0.5], [[0.4, 0.9], [0.7, 0.6], [0.95, 0.8]]]
    late = tail.Rows.known([6, 11], [9, 5])
    with_early = tail.Rows.known([0, 6, 11], [2, 9, 5])
    np.testing.assert_allclose(tail.finished(late, settings),
                               tail.finished(with_early, settings)[:, 1:, :10], rtol=0, atol=1e-12)


def test_call_rate_matches_a_simulated_lockstep_call():
    """Expected tokens / expected seconds of whole lockstep calls (4 rows, two in the opener, history
    lengths, a row-count slope), 20,000 simulated, within 4.4 standard errors (false alarm ~1e-5)."""
    rng = np.random.default_rng(1)
    alphas = [[0.5, 0.6, 0.7], [0.8, 0.7, 0.6], [0.9, 0.8, 0.5]]
    lengths = tail.Lengths()
    lengths.add(rng.integers(3, 40, 50).tolist())
    done = [0, 0, 5, 9]
    rows = lengths.rows(done, max_new=40)
    exact = tail.call_rates(rows, [alphas], np.array([0.01]), row_slope=0.1, prefill_s=0.02)[0]
    seen, thresholds, n = np.minimum(np.array(lengths.seen), 40), np.cumprod(alphas, 1), 20_000
    offset = np.array(done)[None].repeat(n, 0)  # (calls, rows)
    end = np.stack([rng.choice(seen[seen > d], n) for d in done], 1)
    tokens, seconds = (end - offset).sum(1), np.full(n, 0.02)
    while (active := offset < end).any():
        bucket = np.searchsorted(tail.OFFSET_EDGES, offset, side="right")
        accepted = (rng.random(offset.shape)[..., None] < thresholds[bucket]).sum(-1)
        seconds += np.where(active.any(1), 0.01 * (1 + 0.1 * active.sum(1)), 0.0)
        offset = offset + active * (1 + accepted)
    rate = tokens.mean() / seconds.mean()
    # delta method: sd of mean(tokens) / mean(seconds)
    se = rate * np.sqrt(np.var(tokens / tokens.mean() - seconds / seconds.mean()) / n)
    assert abs(exact - rate) < 4.4 * se, (exact, rate, se)


def test_the_tail_changes_the_best_choice():
    """64 rows of 40 tokens, rs K=2 at alpha 0.5: 1.75 tokens a step on average for 1.7x a plain step's
    cost, so rows (1 + E[L]) / cost prefers rs (1.03x plain); but the call lasts until the row with the
    most steps ends (about 28 steps, not 40 / 1.75 = 23), so with the tail priced plain wins."""
    chooser = AutoChooser()
    chooser.acceptance = _acceptance([0.5, 0.5], [0.5, 0.5])
    chooser.costs = StepCosts(seconds={0: 0.001, 2: 0.0017})  # K=2 timed: no draft split needed
    chooser.lengths.add([40] * 64)
    options = [("none", 0), ("rs", 2)]
    assert chooser.choose(options, rows=64).mode == "rs"
    decision = chooser.choose(options, rows=64, tail=chooser.lengths.rows([0] * 64, 48))
    assert decision.mode == "none"
    assert decision.predictions["none"] == pytest.approx(64 / 0.001)  # plain: exactly 40 steps
    steps = 64 * 40 / decision.predictions["rs2"] / 0.0017
    assert 26 < steps < 31  # the longest of 64 rows (mean 22.9 steps, sd 2.3)


def test_step_cost_follows_the_active_rows():
    costs = StepCosts()
    costs.observe(0, [(r, 0.001 * (1 + 0.1 * r), 0.0) for r in (16, 12, 8, 4, 2, 1)])
    assert costs.gamma(0) == pytest.approx(0.1) and costs.seconds[0] == pytest.approx(0.001)
    assert costs.scale(10, 0) == pytest.approx(2.0)
    assert auto.predict("none", 0, None, costs, rows=10) == pytest.approx(10 / 0.002)
    costs.observe(0, [(8, 0.003, 0.0)] * 3)  # one row count: the slope stays; the cost joins the first's (6 steps)
    assert costs.gamma(0) == pytest.approx(0.1) and costs.seconds[0] == pytest.approx((6 * 0.001 + 3 * 0.003 / 1.8) / 9)


def test_the_row_slope_is_per_depth():
    """A step's cost per row grows with the tokens it runs per row: gamma per depth (each fit shrunk
    toward the other depths', GAMMA_PRIOR_STEPS), a line in K for a depth never fitted (one fitted
    drafted depth: its gamma)."""
    costs = StepCosts()
    for k, gamma in ((0, 0.01), (1, 0.02), (3, 0.04)):
        costs.observe(k, [(r, 0.001 * (1 + gamma * r), 0.0) for r in (16, 8, 4, 1) * 25])  # 100 steps each
    m = auto.GAMMA_PRIOR_STEPS
    assert costs.row_slope == pytest.approx({0: 0.01, 1: 0.02, 3: 0.04})
    assert costs.gamma(1) == pytest.approx((100 * 0.02 + m * 0.04) / (100 + m))  # toward depth 3, the other drafted
    assert costs.gamma(0) == pytest.approx(0.01)  # toward the drafted line's K = 0 point, 0.01 (not their mean, 0.03)
    assert costs.gamma(0) < costs.gamma(1) < costs.gamma(3)
    assert costs.gamma(2) == pytest.approx(0.03) and costs.gamma(4) == pytest.approx(0.05)
    assert costs.scale(10, 4) == pytest.approx(1.5)
    one = StepCosts()
    one.observe(2, [(r, 0.001 * (1 + 0.03 * r), 0.0) for r in (16, 8, 4, 1)])
    assert one.gamma(4) == pytest.approx(0.03) and one.gamma(0) == pytest.approx(0.03)
    assert StepCosts().gamma(1) == 0.0


def test_costs_timed_before_the_slope_is_known_are_reread_at_it():
    """A probe runs at one row count (no slope yet); a later call's tail fits it: the probe's cost is then
    a cost at its own rows, not a cost per row unit."""
    costs = StepCosts()
    costs.observe(4, [(16, 0.026, 0.008)] * 2)  # 26 ms at 16 rows, 2 ms a draft step
    assert not costs.row_slope and costs.seconds[4] == pytest.approx(0.026)
    costs.observe(2, [(r, 0.001 * (1 + 0.1 * r), 0.0) for r in (16, 8, 4, 1)])  # gamma = 0.1 at K = 2
    assert costs.gamma(4) == pytest.approx(0.1)  # the one fitted drafted depth's
    assert costs.seconds[4] * costs.scale(16, 4) == pytest.approx(0.026)
    assert costs.draft_s * costs.scale(16, 4) == pytest.approx(0.002)


def test_a_calls_first_step_is_priced_as_prefill():
    """The first step also feeds the head the prompt: it is not a step cost, its excess joins the prefill."""
    result = Completions(prompt_ids=[[1]], token_ids=[[1, 2, 3]], texts=[""], lengths=[3],
                              finish_reasons=["eos"], step_times=[(1, 0.010, 0.0), (1, 0.002, 0.0),
                                                                  (1, 0.002, 0.0)], prefill_seconds=0.005)
    chooser = AutoChooser()
    chooser.costs.observe(0, result.step_times[1:])  # as a probe's plain block: its first step not timed
    chooser.end_call(result, (0, result.step_times[0]))
    assert chooser.costs.seconds[0] == pytest.approx(0.002)
    assert chooser.prefill_s == pytest.approx(0.005 + 0.008)
    assert chooser.lengths.seen == [3]


def test_a_fixed_calls_alphas_and_lengths_reach_the_chooser_not_its_step_times():
    """A fixed setting's call (``AutoChooser.observe``, the engine backend's fixed calls) teaches what a
    call between probes does: alphas, decayed as a call, and lengths; its step times are not a probe's."""
    from bebop.speculative.engine import SamplingParams, SpecConfig, generate
    from tests.helpers import ToyTokenizer, toy_prompts, peaked_model, perturbed_head

    model = peaked_model()
    result = generate(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=12), spec=SpecConfig("rs", 2))
    chooser = AutoChooser()
    chooser.acceptance = _acceptance([0.5] * 2, [0.4] * 2, weight=50)
    chooser.observe(result, "rs", greedy=False)
    fresh = AutoChooser()
    fresh.acceptance.observe(result.log, result.lengths, greedy=False)
    assert chooser.acceptance.weights[0] == pytest.approx(50 * auto.DECAY + fresh.acceptance.weights[0])
    assert chooser.lengths.seen == result.lengths and not chooser.costs.seconds


def test_generate_auto_learns_the_calls_lengths_and_prefill():
    """A call leaves its completion lengths and its prefill's seconds (the head's first pass included)
    to the chooser, for the forecasts of whole calls (``predict_call``)."""
    from bebop.speculative.auto.chooser import generate_auto
    from bebop.speculative.engine import SamplingParams
    from tests.helpers import ToyTokenizer, toy_prompts, peaked_model, perturbed_head

    model = peaked_model()
    chooser = AutoChooser()
    out, decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1),
                                  sampling=SamplingParams(temperature=1.0, max_new_tokens=24), chooser=chooser)
    assert decision.measured_tok_s > 0 and chooser.lengths.seen == out.lengths
    assert chooser.prefill_s >= out.prefill_seconds > 0
