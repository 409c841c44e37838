"""Tests for bebop.speculative.auto.generate: a call that probes, chooses and switches, exactly.

What pins it: bad specs in one line; the probe's steps (one plain step when allowed, the deepest K
until enough positions, a shallower K that could win) then the choice; a held call runs its setting
from the first step with room for its K only; a first choice makes the next call probe; a probe
times afresh and keeps the acceptance and lengths; a one-shot call learns nothing after its
decision; token-identical to plain greedy decoding at T = 0 (both auto flags, EOS, a batch of
different prompt lengths); by chi-square against the enumerated distribution, exact at T = 1 with
the setting switched within the first 3 tokens (2 x 6 checks at 1e-4: a correct implementation
fails with odds at most 1.2e-3 for a seed picked at random; the seed is fixed, so a checkout passes
or fails deterministically). The engine's own switching (``Decoder.set_spec``) is pinned in
tests/speculative/test_engine.py.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from bebop.speculative.auto import acceptance, generate as auto
from bebop.speculative.auto.chooser import AutoChooser, candidates, config_name
from bebop.speculative.auto.generate import generate_auto
from bebop.speculative.auto.tail import Lengths
from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig, generate
from bebop.utils.errors import BebopError
from tests.speculative.auto.helpers import acceptance_of, with_history
from tests.helpers.engine import (
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
                                  chooser=with_history() if history else None)
    expected = [k for k, n in probes for _ in range(n)]
    assert steps[:len(expected)] == expected and len(steps) > len(expected) and decision.probed
    assert set(steps[len(expected):]) == {decision.speculate_k}
    assert out.stats.speculate_k == 4 and decision.measured_tok_s > 0


def test_a_fresh_probe_times_its_plain_step(monkeypatch):
    """The plain first step is a clean plain step (no head input pending is fed): timed as a plain
    cost; the first drafted step feeds the head the whole prompt."""
    monkeypatch.setattr(AutoChooser, "choose", lambda self, options, rows, tail=None:
                        auto.Decision("rs", 1, 1.0, {"rs1": 1.0}, rows))
    model = peaked_model()
    chooser = AutoChooser()
    out, _ = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1),
                           sampling=SamplingParams(temperature=1.0, max_new_tokens=24), chooser=chooser)
    plain_step, first_drafted = out.step_times[0], out.step_times[1]
    assert plain_step[2] == 0.0 and first_drafted[2] > 0  # no drafting, then drafting
    assert chooser.costs.measured[0] == [(plain_step[1], 1)]


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
    """A call the schedule does not probe runs the last probe's decision from the first step: no probe step, no pricing, the
    costs left as the probe timed them; the call's alphas join the (decayed) evidence. A chooser with
    no decision, or one the spec no longer allows, probes. (No confirming probes here: the next test.)"""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24)
    chooser, priced, ks = AutoChooser(confirm=False, every=1000), [], []
    choose, step = AutoChooser.choose, Decoder.step
    monkeypatch.setattr(AutoChooser, "choose", lambda self, *a, **kw: priced.append(1) or choose(self, *a, **kw))
    monkeypatch.setattr(AutoChooser, "shallow_could_win", lambda self, options, rows: 1)  # rs1 timed too
    monkeypatch.setattr(Decoder, "step", lambda self: ks.append(self.runner.k) or step(self))

    def call(seed, spec=SpecConfig("rs", "auto")):  # drafted settings only: every call records alphas
        ks.clear(), priced.clear()
        return generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, sampling=sampling, spec=spec,
                             chooser=chooser, seed=seed)[1]

    probed = call(0)  # nothing held yet
    assert probed.probed and chooser.held is probed and priced == [1]
    costs, weight = copy.deepcopy(chooser.costs), sum(chooser.acceptance.weights)
    kept = call(1)
    assert not kept.probed and priced == [] and chooser.held is probed
    assert (kept.mode, kept.speculate_k, kept.predictions) == (probed.mode, probed.speculate_k, probed.predictions)
    assert set(ks) == {probed.speculate_k} and len(ks) >= 2 and kept.measured_tok_s > 0
    assert chooser.costs == costs and sum(chooser.acceptance.weights) > weight * acceptance.DECAY
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
        chooser.held, chooser.calls = auto.Decision(mode, k, 1.0, {config_name(mode, k): 1.0}), 1  # between probes
        made.clear()
        out, decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, sampling=sampling,
                                      chooser=chooser, seed=4)
        assert not decision.probed and made[0]["max_speculate_k"] == k and (made[0]["mtp"] is None) == (k == 0)
        roomy = Decoder(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, sampling=sampling, seed=4,
                        spec=SpecConfig(mode, max(k, 1)), max_speculate_k=4)
        while roomy.num_active:
            roomy.step()
        assert out.token_ids == roomy.result().token_ids


def test_a_first_chosen_setting_makes_the_next_call_probe(monkeypatch):
    """A call between scheduled probes probes while the held decision awaits confirmation: choices rs2
    (new), rs1 (new), rs2 (chosen before) -> probe, probe, probe, then the fourth call keeps rs2."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    chooser, script, ks = AutoChooser(every=1000), [("rs", 2), ("rs", 1), ("rs", 2)], []
    monkeypatch.setattr(AutoChooser, "choose", lambda self, options, rows, tail=None:
                        auto.Decision(*script.pop(0), 1.0, {}, rows))
    step = Decoder.step
    monkeypatch.setattr(Decoder, "step", lambda self: ks.append(self.runner.k) or step(self))
    probed = []
    for seed in range(4):
        ks.clear()
        decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4)), mtp=head, chooser=chooser,
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
    chooser = with_history()
    chooser.acceptance = acceptance_of([0.5] * 4, [0.4] * 4, weight=50)
    out, decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=head, chooser=chooser,
                                  sampling=SamplingParams(temperature=1.0, max_new_tokens=24))
    assert decision.probed and chooser.held is decision
    assert 3 not in chooser.costs.seconds or decision.speculate_k == 3  # rs3 was timed in an earlier call only
    assert chooser.costs.measured[0][0] == (out.step_times[0][1], 1)  # this call's plain step
    assert chooser.lengths.seen == [5, 7] + out.lengths
    fresh = AutoChooser()
    fresh.acceptance.observe(out.log, out.lengths, greedy=False, age=acceptance.DECAY)
    assert chooser.acceptance.weights[0] == pytest.approx(50 * acceptance.DECAY + fresh.acceptance.weights[0])


def test_a_one_shot_call_learns_nothing_after_its_decision(monkeypatch):
    """Without a chooser the call's own (fresh) one is read by no later call: after the decision it
    records nothing (no end-of-call costs, acceptance or lengths), and the call's tokens and decision
    are those of a call that did."""
    learnt = []
    for owner, name in ((AutoChooser, "settle"), (Lengths, "add")):
        method = getattr(owner, name)
        monkeypatch.setattr(owner, name, lambda self, *a, _m=method, _n=name: learnt.append(_n) or _m(self, *a))
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
    kept, decided_kept = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), chooser=AutoChooser(), **kwargs)
    assert learnt == ["settle", "add"]
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


def test_generate_auto_learns_the_calls_lengths():
    """A call leaves its completion lengths to the chooser (``Lengths.rows`` prices the next call's tail)."""
    model = peaked_model()
    chooser = AutoChooser()
    out, decision = generate_auto(model, ToyTokenizer(), toy_prompts((3, 4, 6)), mtp=perturbed_head(model, 0.1),
                                  sampling=SamplingParams(temperature=1.0, max_new_tokens=24), chooser=chooser)
    assert decision.measured_tok_s > 0 and chooser.lengths.seen == out.lengths
