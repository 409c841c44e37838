"""Tests for bebop.speculative.block: block verification emits exactly the target's distribution.

Layers, as for the token-wise sampler (tests/speculative/test_sampling.py, whose chains they reuse):
  * exact: the closed-form output of a whole verify step (`block_distributions`, which the sampler
    uses) is enumerated over every draft sequence, V = 3..4, K = 1..3, and compared with the target's
    joint to 1e-6; crafted coins pin the sampler to that closed form. A block verifier without the
    block correction of the residual must fail the same enumeration.
  * expectation: block accepts at least as many drafts as token-wise on random chains (exact
    expectations by enumeration), and Sun et al.'s two-token example gives 11/9 against 10/9.
  * statistical: chi-square over 1e5 rows of `block_verify`, and the engine end to end on a V = 8
    model at T = 1 and T = 0.7 with top-k/top-p against the enumerated plain distribution (the engine's
    noise path for both verifiers: test_verification.py). α = 1e-4 per check: the sampler's 3
    p-values and the engine's 2 configs x 4 checks, so an exact implementation fails this file with
    odds at most 1.1e-3 (union bound) for a seed picked at random; seeds are fixed, so a checkout
    passes or fails deterministically. The wrong verifier must fail its chi-square test (p < α).
  * literal: T = 0 equals greedy; K = 1 equals token-wise bit for bit; seeded determinism; input errors.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from bebop.speculative import block
from bebop.speculative.block import (
    accept_block,
    block_distributions,
    expected_block_accepts,
    prefix_weights,
    sampled_block_accepts,
    stop_thresholds,
)
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.speculative.sampling import accept_token_wise, verify_distributions
from bebop.speculative.settings import verify_problem
from bebop.speculative.verification import block_verify, verify_from_noise
from bebop.utils.errors import BebopError
from tests.helpers.engine import (
    STAT_PROMPT,
    STAT_VOCAB,
    ToyTokenizer,
    assert_fits,
    assert_three_tokens_are_plain,
    exact_joint,
    peaked_model,
    perturbed_head,
    stat_model,
    toy_prompts,
)
from tests.helpers.verification import (
    ALPHA,
    CASES,
    EXACT_ATOL,
    JOINT_VOCAB,
    NUM_ROWS as ENGINE_ROWS,
    Chain,
    assert_stops_at,
    block_inputs,
    chain_for,
    chi_square_pvalues,
    continue_plain,
    random_pairs,
    rs_rows,
    sample_tables,
    target_joint,
)

WRONG_GAP = 1e-3  # the wrong verifier must miss the target's joint by more than this somewhere


def _emitted_joint_from_stops(chain, drafts, stop, resample, vocab) -> np.ndarray:
    """Distribution of the first K+1 emitted tokens for one draft sequence: the step stops at n with
    probability stop[n], emits drafts[:n] and a token from resample[n]; then plain target sampling."""
    k = len(drafts)
    joint = np.zeros((vocab,) * (k + 1))
    for seq in itertools.product(range(vocab), repeat=k + 1):
        total = 0.0
        for n in range(k + 1):
            if tuple(seq[:n]) != tuple(drafts[:n]):
                break
            tail = math.prod(chain.p(seq[:t])[seq[t]] for t in range(n + 1, k + 1))
            total += stop[n] * resample[n][seq[n]] * tail
        joint[seq] = total
    return joint


def _block_step_joint(chain, vocab, k, dtype=torch.float64) -> tuple[np.ndarray, float]:
    """(the emitted joint mixed over ŷ ~ q, E[τ]) of one block verify step, from `block_distributions`."""
    drafts, target, draft_tokens, draft_probs, weights = block_inputs(chain, vocab, k, dtype)
    stop, resample = block_distributions(target, draft_tokens, draft_probs)
    assert torch.isfinite(stop).all() and torch.isfinite(resample).all()
    np.testing.assert_allclose(stop.sum(1).numpy(), 1.0, atol=1e-12)
    emitted, expected_accepts = 0.0, 0.0
    for i, (d, w) in enumerate(zip(drafts, weights)):
        if w > 0:
            emitted = emitted + w * _emitted_joint_from_stops(chain, d, stop[i].tolist(),
                                                              resample[i].double().numpy(), vocab)
            expected_accepts += w * float((stop[i] * torch.arange(k + 1)).sum())
    return emitted, expected_accepts


def _token_expected_accepts(chain, vocab, k) -> float:
    drafts, target, draft_tokens, draft_probs, weights = block_inputs(chain, vocab, k)
    accept, _ = verify_distributions(target, draft_tokens, draft_probs)
    return sum(w * float(accept[i].cumprod(0).sum()) for i, w in enumerate(weights))


BLOCK_CASES = [c for c in CASES if c[2] <= 4] + [(f"random_v3_k3_{i}", pair, 3)
                                                  for i, pair in enumerate(random_pairs(3, 2, seed=33))]


# ----------------------------------------------------------------------------- exact


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("name, pair, vocab", BLOCK_CASES, ids=[c[0] for c in BLOCK_CASES])
def test_block_verification_is_exact(name, pair, vocab, k):
    """Mixing over ŷ ~ q, the first K+1 emitted tokens (the step's, then plain sampling) are the target's."""
    if k == 3 and vocab == 4 and name not in ("uniform", "disjoint", "q_has_zeros"):
        pytest.skip("V = 4, K = 3: three awkward cases suffice (the others run at K <= 2)")
    chain = chain_for(pair, vocab)
    emitted, _ = _block_step_joint(chain, vocab, k)
    np.testing.assert_allclose(emitted, target_joint(chain, vocab, k + 1), atol=EXACT_ATOL, rtol=0)


def test_exact_in_float32():
    chain = chain_for(random_pairs(4, 1, seed=7)[0], 4)
    emitted, _ = _block_step_joint(chain, 4, 2, dtype=torch.float32)
    np.testing.assert_allclose(emitted, target_joint(chain, 4, 3), atol=EXACT_ATOL, rtol=0)


def _without_block_correction(monkeypatch):
    """A wrong block verifier: the token after stopping at j < K comes from the token-wise residual
    max(0, p - q) instead of max(0, w_j p - q); the stop thresholds stay right."""
    right = block._emission_weights

    def wrong(target_row, draft_row, weight, is_bonus=None):
        return right(target_row, draft_row, torch.ones_like(weight), is_bonus)

    monkeypatch.setattr(block, "_emission_weights", wrong)


def _random_chain(seed: int) -> Chain:
    pairs = random_pairs(3, 7, seed=200 + seed)
    return Chain(pairs[0], pairs[1:])


@pytest.mark.parametrize("k", [2, 3])
def test_wrong_block_verifier_fails_enumeration(k, monkeypatch):
    """The same enumeration, V = 3, random chains: the uncorrected residual misses the joint by > WRONG_GAP."""
    _without_block_correction(monkeypatch)
    gaps = []
    for seed in range(6):
        chain = _random_chain(seed)
        emitted, _ = _block_step_joint(chain, 3, k)
        gaps.append(np.abs(emitted - target_joint(chain, 3, k + 1)).max())
    assert max(gaps) > WRONG_GAP, gaps


@pytest.mark.parametrize("k", [2, 3])
def test_block_never_accepts_fewer_than_token_wise(k):
    """E[accepted drafts], exact by enumeration, on random prefix-dependent chains: block >= token."""
    gains = []
    for seed in range(6):
        chain = _random_chain(seed)
        _, block_accepts = _block_step_joint(chain, 3, k)
        token_accepts = _token_expected_accepts(chain, 3, k)
        assert block_accepts >= token_accepts - 1e-12, (seed, block_accepts, token_accepts)
        gains.append(block_accepts - token_accepts)
    assert max(gains) > 1e-3  # and strictly more somewhere


def test_sun_et_al_example_and_k1_equals_token_wise():
    """p = (1/3, 2/3), q = (2/3, 1/3) at every step, K = 2: block 11/9 accepted drafts, token-wise 10/9."""
    chain = Chain(([1 / 3, 2 / 3], [2 / 3, 1 / 3]), [([1 / 3, 2 / 3], [2 / 3, 1 / 3])])
    _, block_accepts = _block_step_joint(chain, 2, 2)
    assert block_accepts == pytest.approx(11 / 9, abs=1e-12)
    assert _token_expected_accepts(chain, 2, 2) == pytest.approx(10 / 9, abs=1e-12)
    p = torch.tensor([[[1 / 3, 2 / 3]] * 2], dtype=torch.float64)
    assert expected_block_accepts(p, p.flip(-1)).item() == pytest.approx(11 / 9, abs=1e-12)


def test_helper_examples():
    # prefix_weights docstring: ratios [0.5, 4, 0.5] -> w = [1, 0.5, 1, 0.5].
    q = torch.full((1, 3, 2), 0.5, dtype=torch.float64)
    p = torch.tensor([[[0.25, 0.75], [0.0, 1.0], [0.25, 0.75]]], dtype=torch.float64)
    p_rows = torch.cat([p, p[:, :1]], 1)
    w = prefix_weights(p_rows, torch.tensor([[0, 1, 0]]), q * torch.tensor([1.0, 1.0, 1.0])[:, None].double())
    assert w.tolist() == [[1.0, 0.5, 1.0, 0.5]]
    # block_residual docstring.
    pr, qr = torch.tensor([0.2, 0.8]), torch.tensor([0.5, 0.5])
    assert block.block_residual(pr, qr, torch.tensor(0.5)).tolist() == [0.0, 0.0]
    assert torch.allclose(block.block_residual(pr, qr, torch.tensor(1.0)), torch.tensor([0.0, 0.3]))
    # q(ŷ) = 0: w = 1 if p(ŷ) > 0 else 0, never NaN; p = q gives the 0/0 threshold 0 (deviation 2).
    same = torch.tensor([[[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]]], dtype=torch.float64)
    h, w = stop_thresholds(same, torch.tensor([[2]]), torch.tensor([[[0.5, 0.5, 0.0]]], dtype=torch.float64))
    assert w.tolist() == [[1.0, 0.0]] and h.tolist() == [[1.0, 0.0]]
    h, w = stop_thresholds(same, torch.tensor([[0]]), same[:, :1])
    assert w.tolist() == [[1.0, 1.0]] and h.tolist() == [[1.0, 1.0]]


def test_verifier_follows_the_closed_form():
    """Coins just below / at each threshold: the row stops at the largest j with u_j < h_j, and emits
    the exponential race over that stop's residual."""
    k, vocab = 2, 4
    rows = [block_inputs(chain_for(pair, vocab), vocab, k) for _, pair, v in BLOCK_CASES if v == vocab]
    target = torch.cat([r[1] for r in rows])
    draft_tokens = torch.cat([r[2] for r in rows])
    draft_probs = torch.cat([r[3] for r in rows])
    thresholds, _ = stop_thresholds(target, draft_tokens, draft_probs)  # (B, K+1)
    _, resample = block_distributions(target, draft_tokens, draft_probs)
    race = torch.empty(target.shape[0], vocab, dtype=torch.float64).exponential_(
        generator=torch.Generator().manual_seed(0)) + 1e-3
    h = thresholds[:, 1:]  # (B, K)
    for stop in range(k + 1):
        coins = torch.where((h > 0) & (h < 1), h, 0.5)  # u == h fails; the earlier coins do not matter
        valid = (h[:, stop:] < 1).all(1) if stop < k else torch.ones(h.shape[0], dtype=torch.bool)
        if stop > 0:
            coins[:, stop - 1] = torch.nextafter(h[:, stop - 1], torch.zeros_like(h[:, stop - 1]))  # passes
            valid &= h[:, stop - 1] > 0
        coins = torch.where(valid[:, None], coins, 0.5)
        output, num_accepted = verify_from_noise(accept_block, target, draft_tokens, draft_probs, coins, race)
        assert_stops_at(stop, output, num_accepted, valid, draft_tokens, resample, race)


def test_k1_is_token_wise_bit_for_bit():
    """At K = 1, h_1 = min(1, r_1) and w_0 = 1: the same noise gives the same tokens as rejection sampling."""
    gen = torch.Generator().manual_seed(3)
    target, draft_tokens, draft_probs = rs_rows(sample_tables(seed=3), gen)
    target, draft_tokens, draft_probs = target[:2000, :2], draft_tokens[:2000, :1], draft_probs[:2000, :1]
    coins = torch.rand(2000, 1, generator=gen, dtype=torch.float64).clamp(1e-9, 1 - 1e-9)
    race = torch.empty(2000, JOINT_VOCAB).exponential_(generator=gen) + 1e-6
    got = verify_from_noise(accept_block, target, draft_tokens, draft_probs, coins, race)
    want = verify_from_noise(accept_token_wise, target, draft_tokens, draft_probs, coins, race)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


# ----------------------------------------------------------------------------- expected accepts


def test_expected_block_accepts_matches_enumeration_and_sampling():
    gen = torch.Generator().manual_seed(0)
    vocab, k = 5, 3
    p = torch.softmax(2 * torch.randn(6, k, vocab, generator=gen, dtype=torch.float64), -1)
    q = torch.softmax(2 * torch.randn(6, k, vocab, generator=gen, dtype=torch.float64), -1)
    exact = expected_block_accepts(p, q)
    for n in range(6):
        brute = sum(math.prod(q[n, j, x[j]].item() for j in range(k))
                    * prefix_weights(p[n: n + 1], torch.tensor([x]), q[n: n + 1])[0, 1:].sum().item()
                    for x in itertools.product(range(vocab), repeat=k))
        assert exact[n].item() == pytest.approx(brute, abs=1e-12)
    token = torch.minimum(p, q).sum(-1).cumprod(1).sum(1)
    assert (exact >= token - 1e-12).all()
    mean, var = sampled_block_accepts(p, q, gen, num_draws=4000)
    # 5 standard errors per chain: a false alarm has odds about 6e-7 per chain.
    assert ((mean - exact).abs() <= 5 * var.sqrt() + 1e-9).all()
    with pytest.raises(ValueError, match="atoms"):
        expected_block_accepts(torch.full((1, 4, 600), 1 / 600), torch.full((1, 4, 600), 1 / 600))


# ----------------------------------------------------------------------------- statistical


def test_block_verify_statistics():
    gen = torch.Generator().manual_seed(1)
    tables = sample_tables(seed=1)
    target, draft_tokens, draft_probs = rs_rows(tables, gen)
    output, num_accepted = block_verify(target, draft_tokens, draft_probs, generator=gen)
    assert 0 < (num_accepted == 2).float().mean() < 1 and (num_accepted == 0).any() and (num_accepted == 1).any()
    seq = continue_plain(output, num_accepted, tables[1], tables[2], gen)
    assert min(chi_square_pvalues(seq, *tables[:3])) > ALPHA


def test_chi_square_catches_the_wrong_block_verifier(monkeypatch):
    """Power check: the residual without the block correction fails the same test."""
    gen = torch.Generator().manual_seed(1)
    tables = sample_tables(seed=1)
    target, draft_tokens, draft_probs = rs_rows(tables, gen)
    _without_block_correction(monkeypatch)
    output, num_accepted = block_verify(target, draft_tokens, draft_probs, generator=gen)
    seq = continue_plain(output, num_accepted, tables[1], tables[2], gen)
    assert min(chi_square_pvalues(seq, *tables[:3])) < ALPHA


ENGINE_CONFIGS = {  # K, sampling: T = 1, and T = 0.7 with top-k and top-p
    "block-k2-t1": (2, SamplingParams(temperature=1.0, max_new_tokens=3)),
    "block-k3-t0.7-topk-topp": (3, SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(ENGINE_CONFIGS))
def test_engine_block_matches_exact_distribution(config):
    """The engine with verify="block": marginals of tokens 1..3 and the joint of (1, 2) against plain sampling."""
    k, sampling = ENGINE_CONFIGS[config]
    model, head = stat_model()
    out = generate(model, ToyTokenizer(), [STAT_PROMPT] * ENGINE_ROWS, mtp=head, sampling=sampling,
                   spec=SpecConfig("rs", k, verify="block"), seed=1)
    assert len(out.token_ids) == ENGINE_ROWS
    assert_three_tokens_are_plain(model, out, sampling, config)


# ----------------------------------------------------------------------------- engine, greedy, errors


def _generate(spec, temperature=1.0, seed=0, prompts=None):
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    prompts = prompts or toy_prompts((2, 5, 3, 7))
    return generate(model, ToyTokenizer(), prompts, mtp=head, seed=seed, spec=spec,
                    sampling=SamplingParams(temperature=temperature, max_new_tokens=16))


def test_engine_greedy_block_equals_plain_greedy():
    block_out = _generate(SpecConfig("rs", 3, verify="block"), temperature=0.0)
    plain = _generate(SpecConfig("none"), temperature=0.0)
    assert block_out.token_ids == plain.token_ids


def test_engine_seeded_determinism_and_stats():
    first = _generate(SpecConfig("rs", 3, verify="block"), seed=7)
    assert first.token_ids == _generate(SpecConfig("rs", 3, verify="block"), seed=7).token_ids
    assert first.token_ids != _generate(SpecConfig("rs", 3, verify="block"), seed=8).token_ids
    assert first.stats.num_drafts > 0


def test_verify_setting_errors():
    assert verify_problem("rs", "block") is None and verify_problem("to", "token") is None
    assert "mode rs" in verify_problem("to", "block") and "mode rs" in verify_problem("auto", "block")
    assert "backend engine" in verify_problem("rs", "block", "vllm")
    assert "not one of" in verify_problem("rs", "blocky")
    with pytest.raises(BebopError, match="verify block needs mode rs"):
        _generate(SpecConfig("to", 3, verify="block"))
    p, t, q = torch.full((2, 3, 4), 0.25), torch.zeros(2, 2, dtype=torch.int64), torch.full((2, 2, 4), 0.25)
    with pytest.raises(ValueError, match="draft_probs"):
        block_verify(p, t, None)
    with pytest.raises(ValueError, match="sum to 1"):
        block_verify(p * 2, t, q)


@pytest.mark.slow
def test_engine_wrong_block_verifier_fails(monkeypatch):
    """Power check end to end, with the block correction dropped from the residual everywhere (its mass in
    the thresholds too): the engine's tokens fail the same checks (p < α, or tokens outside p's support).
    The emission-only defect above changes this model's token distributions by less than 1e5 rows resolve."""
    monkeypatch.setattr(block, "block_residual", lambda p, q, w: (p.double() - q.double()).clamp_min(0.0))
    k, sampling = ENGINE_CONFIGS["block-k2-t1"]
    model, head = stat_model()
    out = generate(model, ToyTokenizer(), [STAT_PROMPT] * ENGINE_ROWS, mtp=head, sampling=sampling,
                   spec=SpecConfig("rs", k, verify="block"), seed=1)
    tokens = np.array(out.token_ids)
    joint = exact_joint(model, STAT_PROMPT, sampling)
    v = STAT_VOCAB
    with pytest.raises(AssertionError, match="p = |outside the support"):
        assert_fits(np.bincount(tokens[:, 1], minlength=v), joint.sum((0, 2)), "token 2")
        assert_fits(np.bincount(tokens[:, 2], minlength=v), joint.sum((0, 1)), "token 3")
        assert_fits(np.bincount(tokens[:, 0] * v + tokens[:, 1], minlength=v * v), joint.sum(2), "(1, 2)")
