"""Tests for bebop.speculative.auto.chooser: the acceptance and cost models, the choice, and generation in chunks.

What pins it:
  * the models on synthetic numbers: E[L] and tokens/s by hand, extrapolation of unseen depths,
    the a + b K cost fit, and the choice as the argmax of the predictions (none wins when drafts
    are rarely accepted, to when its alpha is higher at low entropy, rs at high entropy).
  * the models on a real call: the acceptance equals the engine's per-depth means (T > 0) and its
    accept counts (T = 0); a probe's step-cost ratios pooled over probes (``CostShape``) by hand
    and through probing calls.
  * generate_auto: probes, then runs the choice; token-identical to plain greedy decoding at T = 0
    (both auto flags, EOS, a batch of different prompt lengths); by chi-square against the
    enumerated distribution, exact at T = 1 with the setting switched within the first 3 tokens
    (2 x 6 checks at 1e-4: a correct implementation fails with odds at most 1.2e-3 for a seed picked at
    random; the seed is fixed, so a checkout passes or fails deterministically). The engine's own
    switching (``Decoder.set_spec``) is pinned in tests/speculative/test_engine.py.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bebop.speculative.auto import chooser as auto
from bebop.speculative.auto.chooser import (Acceptance, AutoChooser, CostShape, StepCosts, candidates, config_name,
                             expected_accepted, generate_auto, predict)
from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig, generate
from bebop.utils.io import BebopError
from tests.helpers import (
    STAT_PROMPT,
    STAT_VOCAB,
    ToyTokenizer,
    assert_fits,
    exact_joint,
    peaked_model,
    perturbed_head,
    stat_model,
    toy_prompts,
)

ALL = candidates(SpecConfig("auto", "auto"))


def _acceptance(rs: list[float], to: list[float], weight: float = 100.0) -> Acceptance:
    acc = Acceptance()
    for j, (a_rs, a_to) in enumerate(zip(rs, to), start=1):
        acc.add(j, weight, a_rs * weight, a_to * weight)
    return acc


def _costs(plain: float, a: float, b: float, ks=(1, 4)) -> StepCosts:
    """Steps of a + b K seconds, b of them drafting (c_draft = b, c_verify = a)."""
    return StepCosts(seconds={0: plain, **{k: a + b * k for k in ks}}, draft_s=b)


# ----------------------------------------------------------------------------- models, synthetic


def test_expected_accepted_and_predict_by_hand():
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.75)
    assert expected_accepted([]) == 0.0
    acc = _acceptance([0.5, 0.5], [0.2, 0.2])
    costs = StepCosts(seconds={0: 0.004, 2: 0.01})
    assert predict("rs", 2, acc, costs, rows=4) == pytest.approx(4 * 1.75 / 0.01)
    assert predict("to", 2, acc, costs, rows=4) == pytest.approx(4 * (1 + 0.2 + 0.04) / 0.01)
    assert predict("none", 0, acc, costs, rows=4) == pytest.approx(4 / 0.004)
    assert predict("rs", 3, acc, costs, rows=4) == 0.0  # one depth timed: no slope, K=3 unknown


def test_choice_is_the_argmax_of_the_formula():
    acc = _acceptance([0.8, 0.75, 0.7, 0.6], [0.5, 0.45, 0.4, 0.3])
    costs = _costs(0.005, 0.006, 0.002)
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
    chooser.acceptance, chooser.costs = _acceptance(rs, to), _costs(0.005, 0.005, 0.001)
    decision = chooser.choose(ALL, rows=8)
    assert (decision.mode, decision.speculate_k) == winner, decision.predictions


def test_costly_drafts_make_none_win_even_at_high_acceptance():
    chooser = AutoChooser()
    chooser.acceptance, chooser.costs = _acceptance([0.9] * 4, [0.9] * 4), _costs(0.005, 0.01, 0.01)
    assert chooser.choose(ALL, rows=8).mode == "none"


def test_few_positions_lean_on_the_depth_above():
    m = auto.PRIOR_POSITIONS
    assert _acceptance([0.8, 0.6], [0.5, 0.5]).alphas("rs", 4) == pytest.approx(
        [0.8, (60 + 0.8 * m) / (100 + m)] + [(60 + 0.8 * m) / (100 + m)] * 2)  # unseen depths repeat depth 2
    assert _acceptance([0.8], [0.5]).alphas("rs", 3) == pytest.approx([0.8, 0.8, 0.8])
    few = _acceptance([0.8, 0.99], [0.5, 0.5])
    few.weights[1], few.sums["rs"][1] = 2.0, 2 * 0.99  # depth 2 seen twice
    assert few.alphas("rs", 2) == pytest.approx([0.8, (2 * 0.99 + m * 0.8) / (2 + m)])
    assert Acceptance().alphas("rs", 2) == [0.0, 0.0]
    one = _acceptance([0.7], [0.4], weight=1)  # a batch of 1 probed briefly: depth 1 is its mean
    assert one.alphas("rs", 2) == pytest.approx([0.7, 0.7])


def test_step_costs_by_hand_and_decay_halves_the_acceptance_evidence():
    costs = StepCosts(seconds={0: 0.004, 1: 0.009, 4: 0.016}, draft_s=0.002)  # the docstring's example
    assert costs.verify_seconds(2) == pytest.approx(0.007 + 1 / 3 * 1e-3)
    assert costs.step_seconds(2) == pytest.approx(0.004 + 0.007 + 1 / 3 * 1e-3)
    assert costs.step_seconds(4) == 0.016 and costs.step_seconds(0) == 0.004
    one = StepCosts(seconds={4: 0.014}, draft_s=0.002)  # one probed depth, nothing else: c_verify constant
    assert one.step_seconds(2) == pytest.approx(0.006 + 2 * 0.002)
    with_plain = StepCosts(seconds={0: 0.004, 4: 0.014}, draft_s=0.002)  # the plain step is c_verify(0)
    assert with_plain.verify_seconds(2) == pytest.approx(0.005)  # the line through 4 ms at 0 and 6 ms at 4
    one.fit_prefill(4, rows=1, prompt_len=10, prefill_s=0.009)  # 3 ms more than c_verify(4) for 5 more tokens
    assert one.prefill_slope == pytest.approx(0.0006) and one.verify_seconds(2) == pytest.approx(0.0048)
    one.fit_prefill(4, rows=1, prompt_len=4, prefill_s=0.009)  # a prompt shorter than a verify pass: no change
    assert one.prefill_slope == pytest.approx(0.0006)
    assert StepCosts(seconds={0: 0.004, 3: 0.01}).step_seconds(2) is None  # drafting never timed
    observed = StepCosts()
    observed.observe(4, [(8, 0.010, 0.004), (8, 0.012, 0.004), (5, 0.020, 0.008)])
    assert observed.seconds == {4: pytest.approx(0.012)} and observed.draft_s == pytest.approx(0.001)
    weighted = StepCosts(seconds={1: 0.009, 2: 0.012, 4: 0.016}, weights={1: 10.0, 2: 1.0, 4: 1.0}, draft_s=0.002)
    slope, intercept = np.polyfit([1, 2, 4], [0.007, 0.008, 0.008], 1, w=np.sqrt([10.0, 1.0, 1.0]))
    assert weighted.verify_seconds(3) == pytest.approx(intercept + 3 * slope)  # depth 1's many steps pull the line
    # drafting = a part paid once per step (the head's pass over what the last step left pending) + K chained steps
    drafts = StepCosts()
    drafts.observe(1, [(64, 0.011, 0.0019)] * 3)
    assert (drafts.draft_fixed, drafts.draft_s) == (0.0, pytest.approx(0.0019))  # one depth: proportional
    drafts.observe(4, [(64, 0.019, 0.0059)] * 3)
    assert drafts.draft_fixed == pytest.approx(0.0019 - 0.004 / 3) and drafts.draft_s == pytest.approx(0.004 / 3)
    assert drafts.step_seconds(2) == pytest.approx(drafts.verify_seconds(2) + drafts.draft_fixed + 2 * drafts.draft_s)
    assert drafts.verify_seconds(1) == pytest.approx(0.011 - 0.0019) and drafts.verify_seconds(4) == pytest.approx(0.019 - 0.0059)
    assert auto._line([(1, 0.001, 1.0), (4, 0.008, 1.0)], drafting=True)[0] == 0.0  # never a negative fixed part
    observed.observe(4, [(8, 0.017, 0.004)])  # a second block: each block weighs its timed steps
    assert observed.seconds[4] == pytest.approx((3 * 0.012 + 0.017) / 4) and observed.weights[4] == 4
    assert observed.draft_s == pytest.approx(0.001)
    acc = _acceptance([0.8], [0.5], weight=10)
    acc.decay(0.5)
    assert acc.weights == [5.0] and acc.alphas("rs", 1) == pytest.approx([0.8])


def test_a_verify_pass_costs_at_least_a_plain_step():
    """c_verify(K) from the line through the drafted depths is floored at a plain step's cost, taken at
    the rows plain steps ran at and put in depth K's units (its own row slope)."""
    costs = StepCosts()
    costs.observe(0, [(16, 0.006, 0.0)] * 4)
    costs.observe(3, [(16, 0.010, 0.002)] * 4)
    costs.observe(4, [(16, 0.0125, 0.0025)] * 4)  # c_verify 8, 10 ms at K = 3, 4: 2 ms a depth
    costs.row_slope = {0: 0.01, 1: 0.02}
    costs._refresh()
    line = 0.008 - 2 * 0.002  # c_verify(1) on the line: 4 ms, below a plain step's 6 ms
    floor = costs.seconds[0] * costs.scale(16, 0) / costs.scale(16, 1)
    assert costs.verify_seconds(2) == pytest.approx(0.006 / costs.scale(16, 2))  # 6 ms on the line: the floor
    assert costs.verify_seconds(1) == pytest.approx(floor) and floor * costs.scale(16, 1) == pytest.approx(0.006)
    assert costs.verify_seconds(1) > line and costs.verify_seconds(4) == pytest.approx(0.010 / costs.scale(16, 4))


def _rows_steps(gamma: float, rows: list[int], base: float = 0.001) -> list[tuple[int, float, float]]:
    """Steps whose seconds are exactly base * (1 + gamma * rows)."""
    return [(r, base * (1 + gamma * r), 0.0) for r in rows]


def test_only_a_calls_tail_fits_the_row_slope():
    """gamma_K is fitted from ROW_FIT_STEPS or more steps whose rows span half the most or more (a
    call's tail), not from a few steps a few rows apart (an explored block's)."""
    costs = StepCosts()
    assert 3 < auto.ROW_FIT_STEPS <= 6  # the 3-step tail below too short, the 6-step one long enough
    costs.fit_rows(2, _rows_steps(0.5, [64, 62, 60, 58, 40]))  # 24 rows apart, under 32: not a tail
    costs.fit_rows(2, _rows_steps(0.5, [64, 8, 1]))  # a tail's span, 3 steps
    assert costs.row_slope == {}
    costs.fit_rows(2, _rows_steps(0.02, [64, 62, 44, 31, 17, 8]))
    assert costs.row_slope[2] == pytest.approx(0.02)


def test_a_depths_row_slope_leans_on_the_other_depths():
    """A depth's own fit is shrunk toward the other depths' (a line in K through the drafted ones,
    weighted by their steps) with the weight of GAMMA_PRIOR_STEPS steps; an unfitted depth takes theirs."""
    costs = StepCosts()
    tail = [16, 16, 12, 9, 5, 3, 1, 1]
    for _ in range(10):
        costs.fit_rows(4, _rows_steps(0.02, tail))  # 80 steps at K = 4
    assert costs.gamma(4) == pytest.approx(0.02) and costs.gamma(2) == pytest.approx(0.02)  # its own; the only one
    costs.fit_rows(2, _rows_steps(0.044, tail))  # one call at K = 2 (8 steps)
    m = auto.GAMMA_PRIOR_STEPS
    assert costs.row_slope[2] == pytest.approx(0.044)
    assert costs.gamma(2) == pytest.approx((8 * 0.044 + m * 0.02) / (8 + m))
    assert costs.gamma(4) == pytest.approx((80 * 0.02 + m * 0.044) / (80 + m))  # its prior: depth 2's fit
    line = auto._line([(2, 0.044, 8.0), (4, 0.02, 80.0)])  # depth 3, unfitted: the line through both fits
    assert costs.gamma(3) == pytest.approx(line[0] + 3 * line[1])
    assert costs.gamma(0) == pytest.approx(line[0])  # plain: the line's K = 0 point (here flat: their mean)
    assert line[1] == 0.0 and line[0] == pytest.approx((8 * 0.044 + 80 * 0.02) / 88)


def test_plains_row_slope_is_the_drafted_lines_k0_point():
    """A row's cost grows with the tokens a step runs for it (K + 1): plain, never fitted, takes the K = 0
    point of the line through the drafted depths' fits, not their mean; one drafted fit: its value."""
    costs = StepCosts()
    tail = [64, 64, 60, 48, 30, 12, 4, 2]
    costs.fit_rows(2, _rows_steps(0.014, tail))
    assert costs.gamma(0) == pytest.approx(0.014)  # one drafted depth: all there is
    costs.fit_rows(4, _rows_steps(0.018, tail))
    assert costs.gamma(0) == pytest.approx(0.010)  # the line through (2, 0.014) and (4, 0.018) at K = 0
    assert costs.gamma(3) == pytest.approx(0.016)  # an unfitted drafted depth: the same line
    costs.fit_rows(0, _rows_steps(0.005, tail))  # plain's own tail: shrunk toward the line's point
    m = auto.GAMMA_PRIOR_STEPS
    assert costs.gamma(0) == pytest.approx((8 * 0.005 + m * 0.010) / (8 + m))
    steep = StepCosts()  # the line falls below 0 at K = 0: no negative slope
    steep.fit_rows(1, _rows_steps(0.002, tail))
    steep.fit_rows(3, _rows_steps(0.030, tail))
    assert steep.gamma(0) == 0.0


def test_candidates_and_probe_rule():
    assert candidates(SpecConfig("rs", "auto")) == [("rs", 1), ("rs", 2), ("rs", 3), ("rs", 4)]
    assert candidates(SpecConfig("auto", 3)) == [("none", 0), ("to", 3), ("rs", 3)]
    assert auto.probe_rule(ALL) == "rs" and auto.probe_rule(candidates(SpecConfig("to", "auto"))) == "to"
    assert auto.probe_rule(candidates(SpecConfig("none", "auto"))) is None


def test_shallow_probe_only_when_a_shallower_k_could_win():
    """After the deep probe: a shallower K is probed when predicted faster than the deepest."""
    chooser = AutoChooser()
    chooser.costs = StepCosts(seconds={4: 0.014}, draft_s=0.002)  # c_verify 6 ms at any K (no slope known)
    chooser.acceptance = _acceptance([0.95] * 4, [0.9] * 4)  # rs4: 4.52 / 14 ms; rs3: 3.71 / 12 ms (0.96 of it)
    assert chooser.shallow_could_win(ALL, rows=1) is None
    chooser.acceptance = _acceptance([0.9, 0.5, 0.2, 0.1], [0.5] * 4)  # rs1: 1.9 / 8 ms beats rs4: 2.45 / 14 ms
    assert chooser.shallow_could_win(ALL, rows=1) == 1
    chooser.acceptance = _acceptance([0.98] * 4, [0.9] * 4)
    chooser.costs.prefill_slope = 0.001  # verify passes 1 ms cheaper per depth less: rs1 1.98 / 5 ms wins
    assert chooser.shallow_could_win(ALL, rows=1) == 1
    assert chooser.shallow_could_win(candidates(SpecConfig("rs", 3)), rows=1) is None  # one depth


@pytest.mark.parametrize("spec", [SpecConfig("foo", 3), SpecConfig("rs", 0), SpecConfig("auto", True)])
def test_bad_specs_are_one_line(spec):
    model = peaked_model()
    with pytest.raises(BebopError, match="unknown mode 'foo'|speculate_k must be an integer >= 1 or 'auto'"):
        generate_auto(model, ToyTokenizer(), [[1, 2]], mtp=perturbed_head(model, 0.1), spec=spec)
    with pytest.raises(BebopError, match="generate_auto"):
        generate(model, ToyTokenizer(), [[1, 2]], spec=SpecConfig("auto", 3))


def test_mode_none_ignores_k_auto():
    model = peaked_model()
    sampling = SamplingParams(temperature=0.0, max_new_tokens=5)
    out = generate(model, ToyTokenizer(), [[1, 2]], sampling=sampling, spec=SpecConfig("none", "auto"))
    assert out.token_ids == generate(model, ToyTokenizer(), [[1, 2]], sampling=sampling).token_ids


# ----------------------------------------------------------------------------- models, on real calls


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_acceptance_reads_the_engines_statistics(temperature):
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    decoder = Decoder(model, ToyTokenizer(), toy_prompts((3, 5, 8, 2)), mtp=head, time_drafts=True,
                      sampling=SamplingParams(temperature=temperature, max_new_tokens=24), spec=SpecConfig("rs", 3))
    while decoder.num_active:
        decoder.step()
    out = decoder.result()
    acc = Acceptance()
    acc.observe(out.log, out.lengths, greedy=temperature == 0)
    means = {rule: [total / w for total, w in zip(acc.sums[rule], acc.weights)] for rule in ("rs", "to")}
    if temperature:
        engine = out.stats.per_position_means()
        for rule in ("rs", "to"):
            assert means[rule] == pytest.approx(engine[f"alpha_{rule}"], rel=1e-5)
    else:  # accepted at depth j / steps that reached depth j
        hist, per_pos = out.stats.accept_length_hist, out.stats.accepted_per_pos
        assert means["rs"] == pytest.approx([per_pos[j] / sum(hist[j:]) for j in range(3)])
    assert len(out.step_times) > 0 and all(r >= 1 and s > d > 0 for r, s, d in out.step_times)
    for j in range(3):  # the offset buckets split the positions
        assert sum(sub.weights[j] for sub in acc.by_offset if j < len(sub.weights)) == pytest.approx(acc.weights[j])
        assert sum(sub.sums["rs"][j] for sub in acc.by_offset if j < len(sub.weights)) == pytest.approx(acc.sums["rs"][j])


def test_a_whole_call_is_priced_from_the_prefills_token_on():
    """The prefill emits each row's first token: a plain call of known lengths runs max(length) - 1 decode
    steps, and ``predict_call`` prices exactly those (from offset 0 it priced one step more)."""
    model = peaked_model()
    decoder = Decoder(model, ToyTokenizer(), toy_prompts((3, 5, 8, 2)), spec=SpecConfig("none"),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=24))
    assert decoder.active_lengths() == [auto.PREFILL_TOKENS] * 4
    while decoder.num_active:
        decoder.step()
    out = decoder.result()
    chooser = AutoChooser()
    chooser.costs = StepCosts(seconds={0: 0.001})
    chooser.lengths.add([max(out.lengths)] * 4)  # every row as long as the longest: the call's steps
    chooser.prefill_s = 0.002
    assert len(out.step_times) == max(out.lengths) - 1
    tokens, seconds = 4 * max(out.lengths), 0.002 + 0.001 * len(out.step_times)
    assert chooser.predict_call("none", 0, 4, 24) == pytest.approx(tokens / seconds)


def test_acceptance_by_offset_of_a_short_call():
    """Every step of a 4-token call starts below 4 tokens emitted: all in the first offset bucket."""
    model = peaked_model()
    out = generate(model, ToyTokenizer(), toy_prompts((3, 5, 8, 2)), mtp=perturbed_head(model, 0.1),
                   sampling=SamplingParams(temperature=1.0, max_new_tokens=4), spec=SpecConfig("rs", 2))
    acc = Acceptance()
    acc.observe(out.log, out.lengths, greedy=False)
    first, *later = acc.by_offset
    assert first.weights == acc.weights and all(sum(sub.weights) == 0 for sub in later)
    engine = out.stats.per_position_means()["alpha_rs"]
    assert [total / w for total, w in zip(first.sums["rs"], first.weights)] == pytest.approx(engine, rel=1e-5)
    m = auto.PRIOR_POSITIONS  # a bucket's alpha leans on the all-offsets one, then the K's own steps' on that
    a1 = acc.sums["rs"][0] / acc.weights[0]
    pooled = [a1, (acc.sums["rs"][1] + m * a1) / (acc.weights[1] + m)]

    def lean(table, prior):
        return [(table.sums["rs"][j] + m * prior[j]) / (table.weights[j] + m) for j in range(2)]

    own = acc.by_k[2]  # every step ran at K = 2
    assert acc.alphas("rs", 2, 0) == pytest.approx(lean(own.by_offset[0], lean(first, pooled)))
    assert acc.alphas("rs", 2) == pytest.approx(lean(own, pooled))
    assert acc.alphas("rs", 2, 2) == pytest.approx(pooled) and acc.offset_alphas("rs", 2)[2] == pytest.approx(pooled)
    assert Acceptance().offset_alphas("rs", 2) == [[0.0, 0.0]] * 3


def test_a_settings_alphas_lean_on_its_own_steps():
    """Depth j drafts different tokens at different K: K's alphas lean on the steps run at K."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    acc, alone = Acceptance(), {}
    for k in (1, 3):
        out = generate(model, ToyTokenizer(), toy_prompts((3, 5, 8, 2)), mtp=head, sampling=sampling,
                       spec=SpecConfig("rs", k), seed=k)
        acc.observe(out.log, out.lengths, greedy=False)
        alone[k] = Acceptance()
        alone[k].observe(out.log, out.lengths, greedy=False)
    assert set(acc.by_k) == {1, 3} and acc.weights[0] == pytest.approx(alone[1].weights[0] + alone[3].weights[0])
    m = auto.PRIOR_POSITIONS
    pooled = Acceptance(acc.sums, acc.weights).alphas("rs", 3)  # every step's, no per-K record
    own = alone[3]
    assert acc.alphas("rs", 3) == pytest.approx([(own.sums["rs"][j] + m * pooled[j]) / (own.weights[j] + m)
                                                 for j in range(3)])
    assert acc.alphas("rs", 2) == pytest.approx(pooled[:2])  # K = 2 never ran: every step's


def test_a_ks_own_steps_age_only_in_calls_that_run_it():
    """``decay`` ages all steps' evidence; a K's own table ages when that K runs again (``observe``'s age)."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    runs = {k: generate(model, ToyTokenizer(), toy_prompts((3, 5, 8, 2)), mtp=head, sampling=sampling,
                        spec=SpecConfig("rs", k), seed=k) for k in (1, 3)}
    acc = Acceptance()
    acc.observe(runs[3].log, runs[3].lengths, greedy=False, age=0.5)
    own3 = list(acc.by_k[3].weights)
    acc.decay(0.5)
    assert acc.weights == pytest.approx([w * 0.5 for w in own3]) and acc.by_k[3].weights == own3
    acc.observe(runs[1].log, runs[1].lengths, greedy=False, age=0.5)
    assert acc.by_k[3].weights == own3  # K = 1 ran: K = 3's evidence is as it was
    acc.observe(runs[3].log, runs[3].lengths, greedy=False, age=0.5)
    assert acc.by_k[3].weights == pytest.approx([1.5 * w for w in own3])  # aged once, then the same again


# ----------------------------------------------------------------------------- generate_auto


@pytest.mark.parametrize("spec", [SpecConfig("auto", "auto"), SpecConfig("rs", "auto"), SpecConfig("auto", 2)])
def test_auto_is_plain_greedy_at_temperature_zero(spec):
    model = peaked_model(eos_token_id=5)
    head = perturbed_head(model, 0.1)
    prompts = toy_prompts((1, 3, 5, 8, 13))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    plain = generate(model, ToyTokenizer(5), prompts, sampling=greedy)
    out, decision = generate_auto(model, ToyTokenizer(5), prompts, mtp=head, sampling=greedy, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.finish_reasons == plain.finish_reasons and out.texts == plain.texts
    assert (decision.mode, decision.speculate_k) in candidates(spec)
    assert decision.predicted_tok_s == max(decision.predictions.values()) > 0


def _with_history() -> AutoChooser:
    """A chooser with earlier calls' models: plain timed at 1 ms (3 rows), rs3 at 9 ms, lengths seen."""
    chooser = AutoChooser()
    chooser.costs.observe(0, [(3, 0.001, 0.0)])
    chooser.costs.observe(3, [(3, 0.009, 0.003)] * 2)
    chooser.lengths.add([5, 7])
    return chooser


@pytest.mark.parametrize(("spec", "history", "shallow", "probes"), [
    (SpecConfig("auto", "auto"), False, 2, [(0, 1), (4, 2), (2, 2)]),  # one plain step, the deepest K, a shallower one
    (SpecConfig("auto", "auto"), False, None, [(0, 1), (4, 2)]),  # ... no shallower K could win
    (SpecConfig("auto", "auto"), True, 2, [(0, 1), (4, 2), (2, 2)]),  # earlier calls change nothing: timed afresh
    (SpecConfig("rs", "auto"), False, 2, [(4, 2), (2, 2)]),  # plain not allowed: no plain step
])
def test_auto_probes_then_runs_the_choice(monkeypatch, spec, history, shallow, probes):
    """The probe runs one plain step when plain is allowed, the deepest K, then a shallower K when one
    could win (forced here, as it depends on timings); then every step runs the choice."""
    monkeypatch.setattr(AutoChooser, "shallow_could_win", lambda self, options, rows: shallow)
    monkeypatch.setattr(auto, "PROBE_POSITIONS", 0)  # PROBE_STEPS each (the next test pins it)
    assert auto.PROBE_STEPS == 2
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    steps = []
    step = Decoder.step
    monkeypatch.setattr(Decoder, "step", lambda self: steps.append(self.runner.k) or step(self))
    out, decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, spec=spec,
                                  sampling=SamplingParams(temperature=1.0, max_new_tokens=24),
                                  chooser=_with_history() if history else None)
    expected = [k for k, n in probes for _ in range(n)]
    assert steps[:len(expected)] == expected and len(steps) > len(expected) and decision.probed
    assert set(steps[len(expected):]) == {decision.speculate_k}
    assert out.stats.speculate_k == 4 and decision.measured_tok_s > 0


def test_a_fresh_probe_times_its_plain_step_and_prices_the_heads_prompt_as_prefill(monkeypatch):
    """The plain first step is a clean plain step (no head input pending is fed): timed as a plain
    cost. The first drafted step feeds the head the whole prompt: not a step cost; its excess joins
    the prefill."""
    monkeypatch.setattr(AutoChooser, "choose", lambda self, options, rows, tail=None:
                        auto.Decision("rs", 1, 1.0, {"rs1": 1.0}, rows))
    model = peaked_model()
    chooser = AutoChooser()
    out, _ = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1),
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=24), chooser=chooser)
    plain_step, first_drafted = out.step_times[0], out.step_times[1]
    assert plain_step[2] == 0.0 and first_drafted[2] > 0  # no drafting, then drafting
    assert chooser.costs.measured[0] == [(plain_step[0], plain_step[1], 1)]
    excess = chooser.costs.excess(4, first_drafted)
    assert chooser.prefill_s == pytest.approx(out.prefill_seconds + excess)


def test_a_batch_of_one_probes_until_enough_positions(monkeypatch):
    """B = 1: the deep probe runs PROBE_POSITIONS steps (one drafted row each), not PROBE_STEPS."""
    monkeypatch.setattr(AutoChooser, "shallow_could_win", lambda self, options, rows: None)
    model = peaked_model()
    ks = []
    step = Decoder.step
    monkeypatch.setattr(Decoder, "step", lambda self: ks.append(self.runner.k) or step(self))
    monkeypatch.setattr(AutoChooser, "choose", lambda self, options, rows, tail=None:
                        auto.Decision("rs", 1, 1.0, {"rs1": 1.0}, rows))
    generate_auto(model, ToyTokenizer(), toy_prompts((3,)), mtp=perturbed_head(model, 0.1), spec=SpecConfig("rs", "auto"),
                  sampling=SamplingParams(temperature=1.0, max_new_tokens=200))
    assert auto.PROBE_POSITIONS > auto.PROBE_STEPS
    assert ks[:auto.PROBE_POSITIONS] == [4] * auto.PROBE_POSITIONS and ks[auto.PROBE_POSITIONS] == 1


def test_between_probes_the_last_decision_is_kept(monkeypatch):
    """probe=False runs the last probe's decision from the first step: no probe step, no pricing, the
    costs left as the probe timed them; the call's alphas join the (decayed) evidence. A chooser with
    no decision, or one the spec no longer allows, probes. (No confirming probes here: the next test.)"""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24)
    chooser, priced, ks = AutoChooser(confirm=False), [], []
    choose, step = AutoChooser.choose, Decoder.step
    monkeypatch.setattr(AutoChooser, "choose", lambda self, *a, **kw: priced.append(1) or choose(self, *a, **kw))
    monkeypatch.setattr(AutoChooser, "shallow_could_win", lambda self, options, rows: 1)  # rs1 timed too
    monkeypatch.setattr(Decoder, "step", lambda self: ks.append(self.runner.k) or step(self))

    def call(seed, spec=SpecConfig("rs", "auto")):  # drafted settings only: every call records alphas
        ks.clear(), priced.clear()
        return generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, sampling=sampling, spec=spec,
                             chooser=chooser, probe=False, seed=seed)[1]

    probed = call(0)  # nothing held yet
    assert probed.probed and chooser.held is probed and priced == [1]
    costs, weight = chooser.costs.to_state(), sum(chooser.acceptance.weights)
    kept = call(1)
    assert not kept.probed and priced == [] and chooser.held is probed
    assert (kept.mode, kept.speculate_k, kept.predictions) == (probed.mode, probed.speculate_k, probed.predictions)
    assert set(ks) == {probed.speculate_k} and len(ks) >= 2 and kept.measured_tok_s > 0
    assert chooser.costs.to_state() == costs and sum(chooser.acceptance.weights) > weight * auto.DECAY
    chooser.held = auto.Decision("to", 3, 1.0, {"to3": 1.0})  # held, but not allowed by the next spec
    again = call(2, SpecConfig("rs", "auto"))
    assert again.probed and priced == [1] and chooser.held is again and again.mode == "rs"


def test_a_held_call_makes_room_for_its_own_k_only(monkeypatch):
    """A call keeping the held decision never switches: its decoder has room for the held K alone (the
    tokens are those of room for K = 4, same seed) and a held plain call runs no head."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24)
    made, init = [], Decoder.__init__
    monkeypatch.setattr(Decoder, "__init__", lambda self, *a, **kw: made.append(kw) or init(self, *a, **kw))
    for mode, k in (("rs", 2), ("none", 0)):
        chooser = AutoChooser()
        chooser.held = auto.Decision(mode, k, 1.0, {config_name(mode, k): 1.0})
        made.clear()
        out, decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, sampling=sampling,
                                      chooser=chooser, probe=False, seed=4)
        assert not decision.probed and made[0]["max_speculate_k"] == k and (made[0]["mtp"] is None) == (k == 0)
        roomy = Decoder(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, sampling=sampling, seed=4,
                        spec=SpecConfig(mode, max(k, 1)), max_speculate_k=4)
        while roomy.num_active:
            roomy.step()
        assert out.token_ids == roomy.result().token_ids


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


def test_a_first_chosen_setting_makes_the_next_call_probe(monkeypatch):
    """generate_auto with probe=False probes while the held decision awaits confirmation: choices rs2
    (new), rs1 (new), rs2 (chosen before) -> probe, probe, probe, then the fourth call keeps rs2."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    chooser, script, ks = AutoChooser(), [("rs", 2), ("rs", 1), ("rs", 2)], []
    monkeypatch.setattr(AutoChooser, "choose", lambda self, options, rows, tail=None:
                        auto.Decision(*script.pop(0), 1.0, {}, rows))
    step = Decoder.step
    monkeypatch.setattr(Decoder, "step", lambda self: ks.append(self.runner.k) or step(self))
    probed = []
    for seed, probe in enumerate([True, False, False, False]):
        ks.clear()
        decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4)), mtp=head, chooser=chooser, probe=probe,
                                 seed=seed, sampling=SamplingParams(temperature=1.0, max_new_tokens=16))[1]
        probed.append(decision.probed)
    assert probed == [True, True, True, False] and script == []
    assert set(ks) == {2} and chooser.held.confirmed and chooser.tried == {"rs1", "rs2"}


def test_a_probe_times_afresh_and_keeps_the_acceptance_and_lengths(monkeypatch):
    """A probing call forgets the step costs of earlier calls (``restart``) and prices from
    its own steps; the completion lengths of earlier calls stay, and their acceptance evidence
    (decayed), the call's drafted positions added once."""
    monkeypatch.setattr(AutoChooser, "shallow_could_win", lambda self, options, rows: None)
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    chooser = _with_history()
    chooser.acceptance = _acceptance([0.5] * 4, [0.4] * 4, weight=50)
    out, decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, chooser=chooser,
                                  sampling=SamplingParams(temperature=1.0, max_new_tokens=24))
    assert decision.probed and chooser.held is decision
    assert 3 not in chooser.costs.seconds or decision.speculate_k == 3  # rs3 was timed in an earlier call only
    assert chooser.costs.measured[0][0] == (out.step_times[0][0], out.step_times[0][1], 1)  # this call's plain step
    assert chooser.lengths.seen == [5, 7] + out.lengths
    fresh = AutoChooser()
    fresh.acceptance.observe(out.log, out.lengths, greedy=False, age=auto.DECAY)
    assert chooser.acceptance.weights[0] == pytest.approx(50 * auto.DECAY + fresh.acceptance.weights[0])


def test_cost_ratios_pool_over_probes_by_hand():
    """Each probe adds log(cost / the deep step's cost) of every key it timed (a depth's step, its
    drafting), older probes decayed; the probe's own deep step is the level, the pooled ratios price
    the keys it timed (its own timings kept apart), a key it did not time is not priced from them, and
    another batch size keeps its own ratios."""
    shape, probes = CostShape(), [StepCosts() for _ in range(3)]
    for costs, plain, deep in zip(probes, (0.004, 0.006), (0.016, 0.012)):
        costs.observe(0, [(4, plain, 0.0)])
        costs.observe(4, [(4, deep, deep / 4)])
        shape.add(4, costs, ref=4)
    ratio = math.exp((auto.SHAPE_DECAY * math.log(0.25) + math.log(0.5)) / (auto.SHAPE_DECAY + 1))
    assert shape.ratios(4)[0] == pytest.approx((ratio, auto.SHAPE_DECAY + 1))
    assert shape.ratios(4)[("draft", 4)] == pytest.approx((0.25, auto.SHAPE_DECAY + 1))  # a quarter in both
    second = probes[1]
    second.use_shape(shape.ratios(4, set(second.measured)), ref=4, rows=4)
    assert second.seconds[4] == pytest.approx(0.012) and second.seconds[0] == pytest.approx(0.012 * ratio)
    assert second.own[0] == pytest.approx(0.006) and second.draft_s == pytest.approx(0.003 / 4)
    assert shape.ratios(16) == {} and set(shape.sums) == {4}
    third = probes[2]  # a probe that also timed K = 2; the next one did not
    third.observe(0, [(4, 0.005, 0.0)])
    third.observe(2, [(4, 0.008, 0.002)])
    third.observe(4, [(4, 0.010, 0.0025)])
    shape.add(4, third, ref=4)
    fourth = StepCosts()
    fourth.observe(0, [(4, 0.005, 0.0)])
    fourth.observe(4, [(4, 0.010, 0.0025)])
    shape.add(4, fourth, ref=4)
    fourth.use_shape(shape.ratios(4, set(fourth.measured)), ref=4, rows=4)
    assert 2 in shape.ratios(4) and 2 not in fourth.seconds and fourth.step_seconds(2) is not None  # from the line
    assert CostShape.from_state(json.loads(json.dumps(shape.to_state()))) == shape
    with pytest.raises(ValueError):
        CostShape.from_state({"4": {"0": [1.0]}})


def test_a_probing_call_pools_its_cost_ratios(monkeypatch):
    """A probing call adds its timed keys' ratios to the chooser's shape (one plain ratio a probe) and
    prices them from its deep step; ``pool_costs=False`` prices each probe from its own steps, and a
    chooser saved without a shape (an older profile) starts one."""
    monkeypatch.setattr(AutoChooser, "shallow_could_win", lambda self, options, rows: None)
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24)
    pooled, own = AutoChooser(), AutoChooser(pool_costs=False)
    for chooser in (pooled, own):
        for seed in range(2):
            generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, chooser=chooser, seed=seed,
                          sampling=sampling)
    costs, (ratio, weight) = pooled.costs, pooled.shape.ratios(3)[0]
    assert weight == pytest.approx(auto.SHAPE_DECAY + 1) and costs.shape_ref == 4
    assert costs.seconds[0] == pytest.approx(ratio * costs.at_rows(4, 3) / costs.scale(3, 0))
    assert own.shape is None and own.costs.seconds == {k: v for k, v in own.costs.own.items() if isinstance(k, int)}
    restored = AutoChooser.from_state(json.loads(json.dumps(pooled.to_state())))
    assert restored.costs.seconds == costs.seconds and restored.shape == pooled.shape
    assert AutoChooser.from_state(json.loads(json.dumps(own.to_state()))).shape is None
    older = pooled.to_state()
    del older["shape"]
    assert AutoChooser.from_state(json.loads(json.dumps(older))).shape == CostShape()


def test_a_one_shot_call_learns_nothing_after_its_decision(monkeypatch):
    """Without a chooser the call's own (fresh) one is read by no later call: after the decision it
    records nothing (no end-of-call costs, acceptance or lengths), and the call's tokens and decision
    are those of a call that did."""
    learnt = []
    for name in ("end_call", "settle"):
        method = getattr(AutoChooser, name)
        monkeypatch.setattr(AutoChooser, name, lambda self, *a, _m=method, _n=name: learnt.append(_n) or _m(self, *a))
    step, init = Decoder.step, Decoder.__init__

    def timed_step(self):  # NOTE: the decision turns on timings: made the same in both calls
        rows, _, drafting = step(self)
        k = self.runner.k if self.runner.spec.mode != "none" else 0
        self.step_times[-1] = (rows, 0.001 * (1 + k) * (1 + 0.01 * rows), 0.0002 * k if drafting else 0.0)
        return self.step_times[-1]

    def timed_init(self, *args, **kw):
        init(self, *args, **kw)
        self.prefill_seconds = 0.004

    monkeypatch.setattr(Decoder, "step", timed_step)
    monkeypatch.setattr(Decoder, "__init__", timed_init)
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    kwargs = dict(mtp=head, sampling=SamplingParams(temperature=1.0, max_new_tokens=24), seed=5)
    one_shot, decided = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), **kwargs)
    assert learnt == []
    kept, decided_kept = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), chooser=AutoChooser(replay=False),
                                       **kwargs)  # NOTE: a one-shot's chooser replays nothing
    assert learnt == ["settle", "end_call"]
    assert one_shot.token_ids == kept.token_ids
    assert (decided.mode, decided.speculate_k, decided.predictions) == \
        (decided_kept.mode, decided_kept.speculate_k, decided_kept.predictions)


@pytest.mark.parametrize("spec", [SpecConfig("auto", "auto"), SpecConfig("rs", "auto")])
def test_auto_sampling_is_exact(monkeypatch, spec):
    """One probe step per setting, so tokens 1-3 mix the probe's settings and the chosen one: plain, rs
    K=4, then K=2, or rs K=4 then K=2 (no plain allowed): marginals and all three pairs against the
    exact joint of plain sampling."""
    monkeypatch.setattr(auto, "PROBE_STEPS", 1)
    monkeypatch.setattr(AutoChooser, "shallow_could_win", lambda self, options, rows: 2)
    model, head = stat_model()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=3)
    rows = 20_000
    out, _ = generate_auto(model, ToyTokenizer(), [STAT_PROMPT] * rows, mtp=head, sampling=sampling, seed=2, spec=spec)
    tokens = np.array(out.token_ids)
    assert tokens.shape == (rows, 3)
    joint, v = exact_joint(model, STAT_PROMPT, sampling), STAT_VOCAB
    for t, axes in enumerate(((1, 2), (0, 2), (0, 1))):
        assert_fits(np.bincount(tokens[:, t], minlength=v), joint.sum(axes), f"token {t + 1}")
    for (s, t), axis in (((0, 1), 2), ((1, 2), 0), ((0, 2), 1)):
        pairs = np.bincount(tokens[:, s] * v + tokens[:, t], minlength=v * v)
        assert_fits(pairs, joint.sum(axis), f"tokens ({s + 1}, {t + 1})")


def test_a_plain_step_is_never_priced_from_drafted_steps():
    # c_verify(K) does not bound a plain step (it was once taken as a lower bound: at B = 64 here a
    # plain step costs ~0.6 c_verify(1), and plain decoding was never probed where it was best)
    assert StepCosts(seconds={4: 0.014}, draft_s=0.002).step_seconds(0) is None
    assert predict("none", 0, Acceptance(), StepCosts(seconds={4: 0.014}, draft_s=0.002), rows=4) == 0.0
