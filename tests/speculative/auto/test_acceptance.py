"""Tests for bebop.speculative.auto.acceptance: E[L], the shrunk per-depth, per-offset and per-K alphas.

What pins it: E[L] by hand; unseen or little-seen depths leaning on the depth above; decay; on real
calls, the tables equal the engine's per-depth means (T > 0) and its accept counts (T = 0), the
offset buckets split the positions, and a K's alphas lean on its own steps, which age only when it runs.
"""

from __future__ import annotations

import pytest

from bebop.speculative.auto import acceptance as auto
from bebop.speculative.auto.acceptance import Acceptance, expected_accepted
from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig, generate
from tests.speculative.auto.helpers import acceptance_of
from tests.helpers.engine import ToyTokenizer, peaked_model, perturbed_head, toy_prompts


def test_expected_accepted_by_hand():
    assert expected_accepted([0.5, 0.5]) == pytest.approx(0.75)
    assert expected_accepted([]) == 0.0


def test_few_positions_lean_on_the_depth_above():
    m = auto.PRIOR_POSITIONS
    assert acceptance_of([0.8, 0.6], [0.5, 0.5]).alphas("rs", 4) == pytest.approx(
        [0.8, (60 + 0.8 * m) / (100 + m)] + [(60 + 0.8 * m) / (100 + m)] * 2)  # unseen depths repeat depth 2
    assert acceptance_of([0.8], [0.5]).alphas("rs", 3) == pytest.approx([0.8, 0.8, 0.8])
    few = acceptance_of([0.8, 0.99], [0.5, 0.5])
    few.weights[1], few.sums["rs"][1] = 2.0, 2 * 0.99  # depth 2 seen twice
    assert few.alphas("rs", 2) == pytest.approx([0.8, (2 * 0.99 + m * 0.8) / (2 + m)])
    assert Acceptance().alphas("rs", 2) == [0.0, 0.0]
    one = acceptance_of([0.7], [0.4], weight=1)  # a batch of 1 probed briefly: depth 1 is its mean
    assert one.alphas("rs", 2) == pytest.approx([0.7, 0.7])


def test_decay_halves_the_acceptance_evidence():
    acc = acceptance_of([0.8], [0.5], weight=10)
    acc.decay(0.5)
    assert acc.weights == [5.0] and acc.alphas("rs", 1) == pytest.approx([0.8])


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
