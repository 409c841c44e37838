"""Tests for bebop.speculative.auto.chooser: the choice, the probe schedule and what a call teaches.

What pins it: the predictions by hand and the choice as their argmax (none wins when drafts are rarely
accepted, to when its alpha is higher at low entropy, rs at high entropy); a shallower K probed only
when it could win; the tail changing the best choice; a whole call priced from the prefill's token on;
the schedule (every ``every`` calls, and a probe confirming a setting's first choice); a fixed call's
alphas and lengths reaching the chooser; the first step's excess priced as prefill.
"""

from __future__ import annotations

import pytest

from bebop.speculative.auto import acceptance, chooser as auto
from bebop.speculative.auto.acceptance import expected_accepted
from bebop.speculative.auto.chooser import AutoChooser, candidates, config_name, predict
from bebop.speculative.auto.costs import StepCosts
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from tests.speculative.auto.helpers import ALL, acceptance_of, costs_of
from tests.helpers.engine import ToyTokenizer, peaked_model, perturbed_head, toy_prompts


def test_predict_by_hand():
    acc = acceptance_of([0.5, 0.5], [0.2, 0.2])
    costs = StepCosts(seconds={0: 0.004, 2: 0.01})
    assert predict("rs", 2, acc, costs, rows=4) == pytest.approx(4 * 1.75 / 0.01)
    assert predict("to", 2, acc, costs, rows=4) == pytest.approx(4 * (1 + 0.2 + 0.04) / 0.01)
    assert predict("none", 0, acc, costs, rows=4) == pytest.approx(4 / 0.004)
    assert predict("rs", 3, acc, costs, rows=4) == 0.0  # one depth timed: no slope, K=3 unknown


def test_choice_is_the_argmax_of_the_formula():
    acc = acceptance_of([0.8, 0.75, 0.7, 0.6], [0.5, 0.45, 0.4, 0.3])
    costs = costs_of(0.005, 0.006, 0.002)
    chooser = AutoChooser()
    chooser.acceptance, chooser.costs = acc, costs
    decision = chooser.choose(ALL, rows=16)
    for mode, k in ALL:  # every prediction is rows (1 + E[L]) / (a + b K), none rows / plain
        seconds = 0.005 if mode == "none" else 0.006 + 0.002 * k
        tokens = 1 if mode == "none" else 1 + expected_accepted(acc.alphas(mode, k))
        assert decision.predictions[auto.config_name(mode, k)] == pytest.approx(16 * tokens / seconds)
    best = max(decision.predictions, key=decision.predictions.get)
    assert auto.config_name(decision.mode, decision.speculate_k) == best
    assert decision.predicted_tok_s == decision.predictions[best]


@pytest.mark.parametrize("rs, to, winner", [
    ([0.1] * 4, [0.05] * 4, ("none", 0)),  # drafts rarely accepted: plain decoding is fastest
    ([0.93] * 4, [0.97] * 4, ("to", 4)),  # low entropy: p's top token carries almost all mass, TO accepts more
    ([0.75] * 4, [0.4] * 4, ("rs", 3)),  # high entropy: RS keeps the overlap, TO only the top token
    ([0.6, 0.3, 0.2, 0.1], [0.3] * 4, ("rs", 1)),  # acceptance collapses after depth 1: stay shallow
])
def test_the_right_setting_wins(rs, to, winner):
    chooser = AutoChooser()
    chooser.acceptance, chooser.costs = acceptance_of(rs, to), costs_of(0.005, 0.005, 0.001)
    decision = chooser.choose(ALL, rows=8)
    assert (decision.mode, decision.speculate_k) == winner, decision.predictions


def test_costly_drafts_make_none_win_even_at_highacceptance_of():
    chooser = AutoChooser()
    chooser.acceptance, chooser.costs = acceptance_of([0.9] * 4, [0.9] * 4), costs_of(0.005, 0.01, 0.01)
    assert chooser.choose(ALL, rows=8).mode == "none"


def test_candidates_and_probe_rule():
    assert candidates(SpecConfig("rs", "auto")) == [("rs", 1), ("rs", 2), ("rs", 3), ("rs", 4)]
    assert candidates(SpecConfig("auto", 3)) == [("none", 0), ("to", 3), ("rs", 3)]
    assert auto.probe_rule(ALL) == "rs" and auto.probe_rule(candidates(SpecConfig("to", "auto"))) == "to"
    assert auto.probe_rule(candidates(SpecConfig("none", "auto"))) is None


def test_shallow_probe_only_when_a_shallower_k_could_win():
    """After the deep probe: a shallower K is probed when predicted faster than the deepest."""
    chooser = AutoChooser()
    chooser.costs = StepCosts(seconds={4: 0.014}, draft_s=0.002)  # c_verify 6 ms at any K (no slope known)
    chooser.acceptance = acceptance_of([0.95] * 4, [0.9] * 4)  # rs4: 4.52 / 14 ms; rs3: 3.71 / 12 ms (0.96 of it)
    assert chooser.shallow_could_win(ALL, rows=1) is None
    chooser.acceptance = acceptance_of([0.9, 0.5, 0.2, 0.1], [0.5] * 4)  # rs1: 1.9 / 8 ms beats rs4: 2.45 / 14 ms
    assert chooser.shallow_could_win(ALL, rows=1) == 1
    chooser.acceptance = acceptance_of([0.98] * 4, [0.9] * 4)
    chooser.costs.prefill_slope = 0.001  # verify passes 1 ms cheaper per depth less: rs1 1.98 / 5 ms wins
    assert chooser.shallow_could_win(ALL, rows=1) == 1
    assert chooser.shallow_could_win(candidates(SpecConfig("rs", 3)), rows=1) is None  # one depth


def test_the_tail_changes_the_best_choice():
    """64 rows of 40 tokens, rs K=2 at alpha 0.5: 1.75 tokens a step on average for 1.7x a plain step's
    cost, so rows (1 + E[L]) / cost prefers rs (1.03x plain); but the call lasts until the row with the
    most steps ends (about 28 steps, not 40 / 1.75 = 23), so with the tail priced plain wins."""
    chooser = AutoChooser()
    chooser.acceptance = acceptance_of([0.5, 0.5], [0.5, 0.5])
    chooser.costs = StepCosts(seconds={0: 0.001, 2: 0.0017})  # K=2 timed: no draft split needed
    chooser.lengths.add([40] * 64)
    options = [("none", 0), ("rs", 2)]
    assert chooser.choose(options, rows=64).mode == "rs"
    decision = chooser.choose(options, rows=64, tail=chooser.lengths.rows([0] * 64, 48))
    assert decision.mode == "none"
    assert decision.predictions["none"] == pytest.approx(64 / 0.001)  # plain: exactly 40 steps
    steps = 64 * 40 / decision.predictions["rs2"] / 0.0017
    assert 26 < steps < 31  # the longest of 64 rows (mean 22.9 steps, sd 2.3)


def test_settle_holds_a_first_chosen_setting_for_one_call_until_a_probe_confirms_it():
    """A decision for a setting no decision chose before awaits a confirming probe (a chain of new
    settings, each); one for a setting chosen before is held; with confirm=False every decision is held."""
    options = [("none", 0), ("rs", 1), ("rs", 2)]
    decide = lambda mode, k: auto.Decision(mode, k, 1.0, {config_name(mode, k): 1.0})
    chooser = AutoChooser()
    trail = []
    for mode, k in [("rs", 2), ("rs", 2), ("rs", 2), ("rs", 1), ("rs", 2), ("rs", 1), ("none", 0), ("none", 0)]:
        chooser.settle(decide(mode, k))
        trail.append(chooser.holds(options))
        assert chooser.held.confirmed == trail[-1]  # logged as auto/confirmed
    assert trail == [False, True, True, False, True, True, False, True]
    assert chooser.tried == {"rs2", "rs1", "none"}
    unchecked = AutoChooser(confirm=False)
    for mode, k in [("rs", 2), ("rs", 1), ("none", 0)]:
        unchecked.settle(decide(mode, k))
        assert unchecked.holds(options)


def test_the_probe_schedule_is_every_nth_call_and_a_confirming_probe():
    """``should_probe``: the first call and every ``every``-th after, and any call holding no confirmed
    decision the spec allows."""
    chooser, spec = AutoChooser(every=3), SpecConfig("rs", "auto")
    assert chooser.should_probe(spec)  # nothing held
    chooser.settle(auto.Decision("rs", 2, 1.0, {"rs2": 1.0}))  # a first choice: awaits confirmation
    chooser.calls = 1
    assert chooser.should_probe(spec)
    chooser.settle(auto.Decision("rs", 2, 1.0, {"rs2": 1.0}))  # confirmed
    assert [chooser.should_probe(spec) for chooser.calls in range(1, 8)] == [False, False, True, False, False,
                                                                              True, False]
    chooser.calls = 4
    assert chooser.should_probe(SpecConfig("to", "auto"))  # the held rs2 is not a candidate
    assert AutoChooser.from_state(chooser.to_state()).every == 3


def test_a_fixed_calls_alphas_and_lengths_reach_the_chooser_not_its_step_times():
    """A fixed setting's call (``AutoChooser.observe``, the engine backend's fixed calls) teaches what a
    call between probes does: alphas, decayed as a call, and lengths; its step times are not a probe's."""
    model = peaked_model()
    result = generate(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=12), spec=SpecConfig("rs", 2))
    chooser = AutoChooser()
    chooser.acceptance = acceptance_of([0.5] * 2, [0.4] * 2, weight=50)
    chooser.observe(result, "rs", greedy=False)
    fresh = AutoChooser()
    fresh.acceptance.observe(result.log, result.lengths, greedy=False)
    assert chooser.acceptance.weights[0] == pytest.approx(50 * acceptance.DECAY + fresh.acceptance.weights[0])
    assert chooser.lengths.seen == result.lengths and not chooser.costs.seconds
