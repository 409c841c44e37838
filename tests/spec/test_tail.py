"""Tests for the batch's tail in --mode auto's prediction (bebop.spec.tail) and the chooser's calibration.

What pins it, on synthetic numbers (no model): the remaining-length draws, the steps per row, a
call's tokens/s by hand (lockstep: the longest row sets the steps; the step cost follows the active
rows; the prefill), a case where pricing the tail changes the best choice, the row-count slope of the
step cost, the first step priced as prefill, and the per-family calibration.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from bebop.spec import auto, tail
from bebop.spec.auto import AutoChooser, Decision, StepCosts, candidates
from bebop.spec.engine import GenerationResult, SpecConfig
from tests.spec.test_auto import _acceptance


def _remaining(rows: list[int]) -> np.ndarray:
    return np.tile(np.array(rows), (tail.SCENARIOS, 1))


def test_remaining_lengths_follow_the_history_longer_than_each_row():
    lengths = tail.Lengths()
    lengths.add([5, 10])
    out = lengths.remaining([0, 6, 12], max_new=20, rng=np.random.default_rng(0))  # (S, 3)
    assert set(out[:, 0]) == {5, 10}  # both drawn (seeded; odds 2^-15 that a seed misses one)
    assert set(out[:, 1]) == {4} and set(out[:, 2]) == {8}  # only 10 > 6; none > 12: the cap 20
    nothing = tail.Lengths().remaining([3, 5], 20, np.random.default_rng(0))
    assert nothing.shape == (tail.SCENARIOS, 2) and (nothing == [17, 15]).all()


def test_steps_per_row_by_hand():
    rng = np.random.default_rng(0)
    rem = _remaining([7, 1])
    assert (tail.steps_needed(rem, [], rng) == rem).all()  # plain: a token a step
    assert (tail.steps_needed(rem, [1.0, 1.0], rng) == _remaining([3, 1])).all()  # 3 tokens a step
    assert (tail.steps_needed(rem, [0.0, 0.0], rng) == rem).all()


def test_steps_by_offset_bucket_by_hand():
    """Alphas per offset bucket: a step draws from the bucket of the tokens its row emitted before it."""
    assert tail.OFFSET_EDGES == (4, 8)
    never, always = [0.0, 0.0], [1.0, 1.0]
    rem = _remaining([20, 20, 3])
    done = np.array([0, 8, 6])
    steps = tail.steps_needed(rem, [never, never, always], done=done)
    assert (steps == _remaining([8 + 4, 7, 3])).all()  # 8 single tokens, then 3 a step; 20 / 3; 1 at 6, 7 and 8
    steps = tail.steps_needed(rem, [always, never, always], done=np.array([0, 0, 0]))
    assert (steps == _remaining([2 + 2 + 4, 2 + 2 + 4, 1])).all()  # 0-2, 3-5; 6, 7 single; then 12 at 3 a step
    assert (tail.steps_needed(rem, [always] * 3, done=done) == tail.steps_needed(rem, always)).all()


def test_all_settings_priced_at_once_as_one_by_one():
    """``call_rates`` pads every setting to the deepest K and shares the draws: with alphas of 0 or 1
    (no randomness) each setting's rate is the one it gets alone, and equal settings get equal rates."""
    rem, cost = _remaining([2, 10]), (lambda rows: 0.001 + 0.0 * rows)
    settings = [[], [1.0, 1.0], [0.0], [[1.0], [0.0], [1.0]], [1.0, 1.0]]
    together = tail.call_rates(rem, settings, cost, done=np.array([0, 0]))
    alone = [tail.call_rates(rem, [a], cost, done=np.array([0, 0]))[0] for a in settings]
    assert together == pytest.approx(alone)
    assert together[0] == pytest.approx(1200) and together[1] == pytest.approx(12 / 0.004)  # 10 steps; 4 at 3 a step
    assert together[1] == together[4] and together[2] == together[0]  # alpha 0: one token a step, as plain


def test_call_rate_prices_the_lockstep_tail_by_hand():
    """The module's example: rows with 2 and 10 tokens left take 10 plain steps."""
    assert tail.call_rates(_remaining([2, 10]), [[]], lambda r: 0.001 + 0 * r)[0] == pytest.approx(1200)
    # 1 ms per active row: 2 steps at 2 rows, 8 at 1 -> 12 tokens / 12 ms; plus 3 ms prefill -> 15 ms
    assert tail.call_rates(_remaining([2, 10]), [[]], lambda r: 0.001 * r)[0] == pytest.approx(1000)
    assert tail.call_rates(_remaining([2, 10]), [[]], lambda r: 0.001 * r, prefill_s=0.003)[0] == pytest.approx(800)


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
    decision = chooser.choose(options, rows=64, generated=[0] * 64, max_new=48)
    assert decision.mode == "none"
    assert decision.predictions["none"] == pytest.approx(64 / 0.001)  # plain: exactly 40 steps
    steps = 64 * 40 / decision.predictions["rs2"] / 0.0017
    assert 26 < steps < 31  # the longest of 64 rows (mean 22.9 steps, sd 2.3)


def test_step_cost_follows_the_active_rows():
    costs = StepCosts()
    costs.observe(0, [(r, 0.001 * (1 + 0.1 * r), 0.0) for r in (16, 12, 8, 4, 2, 1)])
    assert costs.row_slope == pytest.approx(0.1) and costs.seconds[0] == pytest.approx(0.001)
    assert costs.scale(10) == pytest.approx(2.0)
    assert auto.predict("none", 0, None, costs, rows=10) == pytest.approx(10 / 0.002)
    costs.observe(0, [(8, 0.003, 0.0)] * 3)  # one row count: the slope stays; the cost joins the first's (6 steps)
    assert costs.row_slope == pytest.approx(0.1) and costs.seconds[0] == pytest.approx((6 * 0.001 + 3 * 0.003 / 1.8) / 9)


def test_costs_timed_before_the_slope_is_known_are_reread_at_it():
    """A probe runs at one row count (no slope yet); a later call's tail fits it: the probe's cost is then
    a cost at its own rows, not a cost per row unit."""
    costs = StepCosts()
    costs.observe(4, [(16, 0.026, 0.008)] * 2)  # 26 ms at 16 rows, 2 ms a draft step
    assert costs.row_slope is None and costs.seconds[4] == pytest.approx(0.026)
    costs.observe(2, [(r, 0.001 * (1 + 0.1 * r), 0.0) for r in (16, 8, 4, 1)])  # gamma = 0.1
    assert costs.row_slope == pytest.approx(0.1)
    assert costs.seconds[4] * costs.scale(16) == pytest.approx(0.026)
    assert costs.draft_s * costs.scale(16) == pytest.approx(0.002)


def test_a_calls_first_step_is_priced_as_prefill():
    """The first step also feeds the head the prompt: it is not a step cost, its excess joins the prefill."""
    result = GenerationResult(prompt_ids=[[1]], token_ids=[[1, 2, 3]], texts=[""], lengths=[3],
                              finish_reasons=["eos"], step_times=[(1, 0.010, 0.0), (1, 0.002, 0.0),
                                                                  (1, 0.002, 0.0)], prefill_seconds=0.005)
    chooser = AutoChooser()
    chooser.observe(result, "none", 1, greedy=False)
    assert chooser.costs.seconds[0] == pytest.approx(0.002)
    assert chooser.prefill_s == pytest.approx(0.005 + 0.008)
    assert chooser.lengths.seen == [3]


def test_calibration_per_family():
    chooser = AutoChooser()
    chooser.acceptance = _acceptance([0.5] * 4, [0.5] * 4)
    chooser.costs = StepCosts(seconds={0: 0.001, 1: 0.0015, 4: 0.003}, draft_s=0.0004)
    chooser.lengths.add([20] * 8)
    options = candidates(SpecConfig("auto", "auto"))
    raw = chooser.choose(options, rows=8, generated=[0] * 8, max_new=20).predictions
    w = auto.CALIBRATION
    chooser.calibrate(Decision("rs", 2, 0.0, {}, measured_tok_s=90.0, raw_tok_s=100.0))
    assert chooser.factor("to") == pytest.approx(0.9 ** w)
    assert chooser.factor("none") == pytest.approx(0.9 ** w)  # never measured: the known families' mean
    chooser.calibrate(Decision("none", 0, 0.0, {}, measured_tok_s=120.0, raw_tok_s=100.0))
    assert chooser.factor("none") == pytest.approx(1.2 ** w) and chooser.factor("rs") == pytest.approx(0.9 ** w)
    chooser.calibrate(Decision("rs", 2, 0.0, {}, measured_tok_s=90.0, raw_tok_s=100.0))
    rs = (1 - w) * w * math.log(0.9) + w * math.log(0.9)
    assert math.log(chooser.factor("rs")) == pytest.approx(rs)
    calibrated = chooser.choose(options, rows=8, generated=[0] * 8, max_new=20)
    for name, value in raw.items():
        fam = "none" if name == "none" else "rs"
        assert calibrated.predictions[name] == pytest.approx(value * chooser.factor(fam))
    chooser.calibrate(Decision("rs", 2, 0.0, {}))  # nothing measured: no update
    assert math.log(chooser.factor("rs")) == pytest.approx(rs)
    chooser.calibrate(Decision("rs", 2, 0.0, {}, measured_tok_s=10.0, raw_tok_s=100.0))  # one outlying call: clipped
    assert math.log(chooser.factor("rs")) == pytest.approx((1 - w) * rs - w * auto.MAX_CALIBRATION_STEP)
    assert 0.1 < math.exp(-auto.MAX_CALIBRATION_STEP) < 0.9


@pytest.mark.parametrize("min_steps, calibrated", [(1, True), (10**6, False)])
def test_generate_auto_calibrates_only_after_enough_steps(monkeypatch, min_steps, calibrated):
    """A rest of a few steps is dominated by its last, partial step: no calibration from it."""
    from bebop.spec.auto import generate_auto
    from bebop.spec.engine import SamplingParams
    from tests.spec.test_engine import ToyTokenizer, _prompts, peaked_model, perturbed_head

    monkeypatch.setattr(auto, "MIN_CALIBRATION_STEPS", min_steps)
    model = peaked_model()
    chooser = AutoChooser()
    _, decision = generate_auto(model, ToyTokenizer(), _prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1),
                                sampling=SamplingParams(temperature=1.0, max_new_tokens=24), chooser=chooser)
    assert decision.measured_tok_s > 0 and bool(chooser.log_ratio) == calibrated
    assert chooser.lengths.seen and chooser.prefill_s > 0
