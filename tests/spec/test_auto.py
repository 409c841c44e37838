"""Tests for bebop.spec.auto: the acceptance and cost models, the choice, and generation in chunks.

What pins it:
  * the models on synthetic numbers: E[L] and tokens/s by hand, extrapolation of unseen depths,
    the a + b K cost fit, and the choice as the argmax of the predictions (none wins when drafts
    are rarely accepted, to when its alpha is higher at low entropy, rs at high entropy).
  * the models on a real call: the acceptance equals the engine's per-depth means (T > 0) and its
    accept counts (T = 0).
  * generate_auto: token-identical to plain greedy decoding at T = 0 (both auto flags, EOS, a batch
    of different prompt lengths), and, by chi-square against the enumerated distribution, exact at
    T = 1 across chunk boundaries (6 checks at 1e-4: a correct implementation fails with odds at most
    6e-4 for a seed picked at random; the seed is fixed, so a checkout passes or fails deterministically).
"""

from __future__ import annotations

import numpy as np
import pytest

from bebop.spec import SpecStats
from bebop.spec import auto
from bebop.spec.auto import Acceptance, AutoChooser, StepCosts, candidates, expected_accepted, generate_auto, predict
from bebop.spec.engine import SamplingParams, SpecConfig, generate
from bebop.utils.io import BebopError
from tests.spec.test_engine import (
    STAT_PROMPT,
    STAT_VOCAB,
    ToyTokenizer,
    _prompts,
    _stat_model,
    assert_fits,
    exact_joint,
    peaked_model,
    perturbed_head,
)

ALL = candidates(SpecConfig("auto", "auto"))


def _acceptance(rs: list[float], to: list[float], weight: float = 100.0) -> Acceptance:
    acc = Acceptance()
    for j, (a_rs, a_to) in enumerate(zip(rs, to), start=1):
        acc.add(j, weight, a_rs * weight, a_to * weight)
    return acc


def _costs(plain: float, a: float, b: float, ks=(1, 4)) -> StepCosts:
    return StepCosts(seconds={0: plain, **{k: a + b * k for k in ks}})


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


def test_unseen_depths_are_extrapolated_conservatively():
    assert _acceptance([0.8, 0.6], [0.5, 0.5]).alphas("rs", 4) == pytest.approx([0.8, 0.6, 0.45, 0.3375])
    assert _acceptance([0.8, 0.6], [0.5, 0.5]).alphas("to", 3) == pytest.approx([0.5, 0.5, 0.5])  # never rises
    assert _acceptance([0.8], [0.5]).alphas("rs", 3) == pytest.approx([0.8, 0.72, 0.648])  # UNSEEN_DECAY
    few = _acceptance([0.8, 0.99], [0.5, 0.5])
    few.weights[1] = auto.MIN_POSITIONS / 2  # depth 2 seen too rarely to trust
    assert few.alphas("rs", 2) == pytest.approx([0.8, 0.72])
    assert Acceptance().alphas("rs", 2) == [0.0, 0.0]


def test_cost_line_fits_two_depths_and_decay_halves_the_evidence():
    costs = _costs(0.004, 0.006, 0.002, ks=(1, 2, 4))
    assert costs.line() == pytest.approx((0.006, 0.002))
    assert costs.step_seconds(3) == pytest.approx(0.012)
    assert StepCosts(seconds={0: 0.004, 3: 0.01}).step_seconds(2) is None
    acc = _acceptance([0.8], [0.5], weight=10)
    acc.decay(0.5)
    assert acc.weights == [5.0] and acc.alphas("rs", 1) == pytest.approx([0.8])


def test_candidates_and_probe_plan():
    assert candidates(SpecConfig("rs", "auto")) == [("rs", 1), ("rs", 2), ("rs", 3), ("rs", 4)]
    assert candidates(SpecConfig("auto", 3)) == [("none", 0), ("to", 3), ("rs", 3)]
    assert auto.probe_plan(ALL, 48) == [("rs", 4, 4), ("rs", 1, 4), ("none", 0, 4)]
    assert auto.probe_plan(candidates(SpecConfig("to", "auto")), 6) == [("to", 4, 2), ("to", 1, 2)]
    assert auto.probe_plan(candidates(SpecConfig("auto", 2)), 48) == [("rs", 2, 4), ("none", 0, 4)]


@pytest.mark.parametrize("spec", [SpecConfig("foo", 3), SpecConfig("rs", 0), SpecConfig("auto", True)])
def test_bad_specs_are_one_line(spec):
    model = peaked_model()
    with pytest.raises(BebopError, match="unknown mode 'foo'|speculate_k must be an integer >= 1 or 'auto'"):
        generate_auto(model, ToyTokenizer(), [[1, 2]], mtp=perturbed_head(model, 0.1), spec=spec)
    with pytest.raises(BebopError, match="generate_auto"):
        generate(model, ToyTokenizer(), [[1, 2]], spec=SpecConfig("auto", 3))


# ----------------------------------------------------------------------------- models, on real calls


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_acceptance_reads_the_engines_statistics(temperature):
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    out = generate(model, ToyTokenizer(), _prompts((3, 5, 8, 2)), mtp=head,
                   sampling=SamplingParams(temperature=temperature, max_new_tokens=24), spec=SpecConfig("rs", 3))
    acc = Acceptance()
    acc.observe(out.stats, greedy=temperature == 0)
    if temperature:
        means = out.stats.per_position_means()
        for rule in ("rs", "to"):
            assert acc.alphas(rule, 3) == pytest.approx(means[f"alpha_{rule}"], rel=1e-5)
    else:  # accepted at depth j / steps that reached depth j
        hist, per_pos = out.stats.accept_length_hist, out.stats.accepted_per_pos
        assert acc.alphas("rs", 3) == pytest.approx([per_pos[j] / sum(hist[j:]) for j in range(3)])
    assert len(out.step_times) > 0 and all(r >= 1 and s > 0 for r, s in out.step_times)


def test_stats_merge_of_different_depths():
    a = SpecStats(speculate_k=1)
    a.record_verify([0, 1])
    b = SpecStats(speculate_k=3)
    b.record_verify([3])
    with pytest.raises(ValueError):
        SpecStats(speculate_k=1).merge(b)
    merged = a.merge(b, mixed_k=True)
    assert merged.speculate_k == 3 and merged.num_drafts == 3 and merged.num_draft_tokens == 5
    assert merged.accepted_per_pos == [2, 1, 1] and merged.accept_length_hist == [1, 1, 0, 1]


# ----------------------------------------------------------------------------- generate_auto


@pytest.mark.parametrize("spec", [SpecConfig("auto", "auto"), SpecConfig("rs", "auto"), SpecConfig("auto", 2)])
def test_auto_is_plain_greedy_at_temperature_zero(spec):
    model = peaked_model(eos_token_id=5)
    head = perturbed_head(model, 0.1)
    prompts = _prompts((1, 3, 5, 8, 13))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20)
    plain = generate(model, ToyTokenizer(5), prompts, sampling=greedy)
    out, decision = generate_auto(model, ToyTokenizer(5), prompts, mtp=head, sampling=greedy, spec=spec)
    assert out.token_ids == plain.token_ids
    assert out.finish_reasons == plain.finish_reasons and out.texts == plain.texts
    assert (decision.mode, decision.speculate_k) in candidates(spec)
    assert decision.predicted_tok_s == max(decision.predictions.values()) > 0


def test_auto_stop_string_across_chunks_cuts_like_one_call():
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    prompts = _prompts((3, 4))
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    full, _ = generate_auto(model, ToyTokenizer(), prompts, mtp=head, sampling=sampling)
    stop = " ".join(ToyTokenizer().decode(full.token_ids[0][1:4]).split())  # tokens 2-4: spans the first chunk's end
    cut, _ = generate_auto(model, ToyTokenizer(), prompts, mtp=head,
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=12, stop=(stop,)))
    assert cut.token_ids[0] == full.token_ids[0][:4] and cut.finish_reasons[0] == "stop"


def test_auto_sampling_is_exact_across_chunks():
    """Tokens 1-2 come from the first probe chunk, token 3 from the second (a fresh call whose
    randomness must be independent of the first's): marginals and all three pairs against the exact
    joint of plain sampling."""
    model, head = _stat_model()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=3)
    rows = 20_000
    out, _ = generate_auto(model, ToyTokenizer(), [STAT_PROMPT] * rows, mtp=head, sampling=sampling, seed=2)
    tokens = np.array(out.token_ids)
    assert tokens.shape == (rows, 3)
    joint, v = exact_joint(model, STAT_PROMPT, sampling), STAT_VOCAB
    for t, axes in enumerate(((1, 2), (0, 2), (0, 1))):
        assert_fits(np.bincount(tokens[:, t], minlength=v), joint.sum(axes), f"token {t + 1}")
    for (s, t), axis in (((0, 1), 2), ((1, 2), 0), ((0, 2), 1)):
        pairs = np.bincount(tokens[:, s] * v + tokens[:, t], minlength=v * v)
        assert_fits(pairs, joint.sum(axis), f"tokens ({s + 1}, {t + 1})")
