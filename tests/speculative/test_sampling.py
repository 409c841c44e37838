"""Tests for bebop.speculative.sampling: token-wise verification must emit exactly the target's distribution.

Three layers (the shape both verifiers share, its engine path and greedy: test_verification.py):
  * exact: the closed-form output distribution (from `verify_distributions`, which `accept_token_wise`
    uses) is enumerated over every draft sequence and compared with the target's to 1e-6, for awkward
    p, q; crafted noise then pins the verifier to those closed forms (threshold, recovered, bonus token).
  * statistical: chi-square over 1e5 rows drawn by `rejection_sample`, RS and TO. α = 1e-4 per check
    and 6 checks, so a correct verifier fails the file with odds at most 6e-4 (union bound) for a seed
    picked at random; seeds are fixed, so a given checkout passes or fails deterministically.
  * literal: logits_to_probs cases, the helpers' examples written by hand, and `keyed_race` against the
    race over its noise drawn whole.
"""

import math

import numpy as np
import pytest
import torch

from bebop.speculative import rng, sampling
from bebop.speculative.sampling import (
    PAD_TOKEN_ID,
    accept_token_wise,
    acceptance_probs,
    keyed_race,
    logits_to_probs,
    recovery_weights,
    sample_from_probs,
    verify_distributions,
)
from bebop.speculative.verification import rejection_sample, verify_from_noise
from tests.helpers.verification import (
    ALPHA,
    AWKWARD,
    CASES,
    EXACT_ATOL,
    JOINT_VOCAB,
    NUM_ROWS,
    assert_stops_at,
    block_inputs,
    chain_for,
    chi_square_pvalues,
    continue_plain,
    emitted_joint,
    random_pairs,
    rs_rows,
    sample_tables,
    target_joint,
)

@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name, pair, vocab", CASES, ids=[c[0] for c in CASES])
def test_rejection_sampling_is_exact(name, pair, vocab, k):
    """RS: mixing over ŷ ~ q, the first K+1 emitted tokens are distributed exactly as the target's."""
    chain = chain_for(pair, vocab)
    drafts, target, draft_tokens, draft_probs, weights = block_inputs(chain, vocab, k)
    accept, resample = verify_distributions(target, draft_tokens, draft_probs)
    assert torch.isfinite(accept).all() and torch.isfinite(resample).all()
    emitted = sum(
        w * emitted_joint(chain, d, accept[i].tolist(), resample[i].numpy(), vocab)
        for i, (d, w) in enumerate(zip(drafts, weights)) if w > 0
    )
    np.testing.assert_allclose(emitted, target_joint(chain, vocab, k + 1), atol=EXACT_ATOL, rtol=0)


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name, pair, vocab", CASES, ids=[c[0] for c in CASES])
def test_target_only_is_exact_for_any_draft(name, pair, vocab, k):
    """TO: for every fixed draft sequence (argmax q included), the output is exactly the target's."""
    chain = chain_for(pair, vocab)
    drafts, target, draft_tokens, _, _ = block_inputs(chain, vocab, k)
    accept, resample = verify_distributions(target, draft_tokens, None)
    expected = target_joint(chain, vocab, k + 1)
    for i, d in enumerate(drafts):
        emitted = emitted_joint(chain, d, accept[i].tolist(), resample[i].numpy(), vocab)
        np.testing.assert_allclose(emitted, expected, atol=EXACT_ATOL, rtol=0, err_msg=f"drafts {d}")
    argmax_drafts = [int(np.argmax(chain.q(())))]
    for _ in range(1, k):
        argmax_drafts.append(int(np.argmax(chain.q(tuple(argmax_drafts)))))
    assert tuple(argmax_drafts) in drafts  # the TO rule's own draft is among those checked


def test_exact_in_float32():
    chain = chain_for(random_pairs(5, 1, seed=7)[0], 5)
    drafts, target, draft_tokens, draft_probs, weights = block_inputs(chain, 5, 2, dtype=torch.float32)
    accept, resample = verify_distributions(target, draft_tokens, draft_probs)
    assert resample.dtype == torch.float32
    emitted = sum(w * emitted_joint(chain, d, accept[i].tolist(), resample[i].double().numpy(), 5)
                  for i, (d, w) in enumerate(zip(drafts, weights)))
    np.testing.assert_allclose(emitted, target_joint(chain, 5, 3), atol=EXACT_ATOL, rtol=0)


@pytest.mark.parametrize("use_draft_probs", [True, False], ids=["rs", "to"])
def test_verifier_follows_the_closed_form(use_draft_probs):
    """Crafted coins just below / at each acceptance threshold stop the block exactly where the
    closed form says; the emitted token is the exponential race over that row's distribution."""
    k, vocab = 2, 4
    rows = [block_inputs(chain_for(pair, vocab), vocab, k) for pair in AWKWARD.values()]
    target = torch.cat([r[1] for r in rows])
    draft_tokens = torch.cat([r[2] for r in rows])
    draft_probs = torch.cat([r[3] for r in rows]) if use_draft_probs else None
    accept, resample = verify_distributions(target, draft_tokens, draft_probs)
    race = torch.empty(target.shape[0], vocab, dtype=torch.float64).exponential_(
        generator=torch.Generator().manual_seed(0)) + 1e-3
    for stop in range(k + 1):
        below = torch.nextafter(accept, torch.zeros_like(accept))  # u < a: accept
        coins = torch.full_like(accept, 0.5)
        coins[:, :stop] = below[:, :stop]
        valid = (accept[:, :stop] > 0).all(1)
        if stop < k:
            at_threshold = accept[:, stop]  # u == a: reject (any u rejects when a == 0)
            coins[:, stop] = torch.where(at_threshold > 0, at_threshold, 0.5)
            valid &= accept[:, stop] < 1
        coins = torch.where(valid[:, None], coins, 0.5)
        output, num_accepted = verify_from_noise(accept_token_wise, target, draft_tokens, draft_probs, coins, race)
        assert_stops_at(stop, output, num_accepted, valid, draft_tokens, resample, race)


def test_helper_examples_and_zero_handling():
    p = torch.tensor([[[0.2, 0.8], [0.5, 0.5]]])  # (1, K+1=2, V=2)
    q = torch.tensor([[[0.5, 0.5]]])
    assert acceptance_probs(p, torch.tensor([[0]]), q).item() == pytest.approx(0.4)
    assert acceptance_probs(p, torch.tensor([[1]]), q).item() == 1.0
    assert acceptance_probs(p, torch.tensor([[0]]), None).item() == pytest.approx(0.2)
    # q(ŷ) = 0: accept if p(ŷ) > 0, reject if p(ŷ) = 0; never NaN.
    p0 = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    q0 = torch.tensor([[[1.0, 0.0, 0.0]]])
    assert acceptance_probs(p0, torch.tensor([[1]]), q0).item() == 1.0
    assert acceptance_probs(p0, torch.tensor([[2]]), q0).item() == 0.0
    w = recovery_weights(torch.tensor([0.2, 0.8]), torch.tensor(0), torch.tensor([0.5, 0.5]))
    assert torch.allclose(w, torch.tensor([0.0, 0.3]))
    assert torch.equal(recovery_weights(torch.tensor([0.2, 0.8]), torch.tensor(1)), torch.tensor([0.2, 0.0]))
    assert torch.equal(recovery_weights(torch.tensor([0.2, 0.8]), torch.tensor(PAD_TOKEN_ID),
                                        torch.tensor([0.5, 0.5])), torch.tensor([0.2, 0.8]))
    # Degenerate residual (p == q): fall back to p.
    same = torch.tensor([0.3, 0.7])
    assert torch.equal(recovery_weights(same, torch.tensor(0), same), same)
    # Exponential race example from the docstring.
    assert sample_from_probs(torch.tensor([0.0, 1.0, 3.0]), torch.tensor([0.5, 1.0, 2.0])).item() == 2


def _both_races(weights: torch.Tensor, keys: torch.Tensor, counters: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`keyed_race` at the rows' stream keys and counters, and its definition: the stream's (B, V) noise drawn
    whole (`rng.keyed_bits`), then one argmax per row."""
    noise = rng.exponential_from_bits(rng.keyed_bits(keys[:, None], counters, (weights.shape[-1],)))[:, 0]
    return keyed_race(weights, rng.counter_keys(keys[:, None], counters)[:, 0]), sample_from_probs(
        weights, noise.to(weights.dtype))


@pytest.mark.parametrize("block", [1, 7, 64, sampling.RACE_BLOCK_ELEMENTS], ids=lambda b: f"block={b}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_keyed_race_is_the_race_over_its_noise_drawn_whole(monkeypatch, block, dtype):
    """Any block size gives the tokens of one race over the whole row, sampled, filtered (zeros) and peaked rows,
    float32 and float64; blocks of 1 value per row make every token its own block."""
    monkeypatch.setattr(sampling, "RACE_BLOCK_ELEMENTS", block)
    g = torch.Generator().manual_seed(5)
    keys = rng.stream_keys(rng.derive_seeds(1, 2, torch.arange(5)), [3])[:, 0]
    for vocab in (1, 2, 13, 300):
        weights = torch.softmax(4 * torch.randn(5, vocab, generator=g, dtype=dtype), -1)
        weights[1, ::2] = 0.0  # a filtered row
        for counter in range(20):
            counters = torch.arange(5) + counter
            got, want = _both_races(weights, keys, counters)
            assert torch.equal(got, want)


@pytest.mark.parametrize("block", [1, 2, 3], ids=lambda b: f"block={b}")
def test_keyed_race_ties_and_nan_as_one_argmax(monkeypatch, block):
    """Ties across blocks go to the first maximal token and a NaN wins from where it first appears, as
    torch.argmax over the whole row decides; a row of 4 tokens spans 1 to 4 blocks."""
    monkeypatch.setattr(sampling, "RACE_BLOCK_ELEMENTS", block)
    inf, nan = float("inf"), float("nan")
    weights = torch.tensor([[0.1, inf, 0.2, inf], [0.1, 0.2, 0.3, nan], [nan, 0.5, nan, 0.1], [0.0, 0.0, 0.0, 0.0]])
    keys = rng.stream_keys(rng.derive_seeds(0, 0, torch.arange(4)), [1])[:, 0]
    counters = torch.zeros(4, dtype=torch.int64)
    got, want = _both_races(weights, keys, counters)
    assert torch.equal(got, want) and got.tolist() == [1, 3, 0, 0]


# ----------------------------------------------------------------------------- statistical

def test_rejection_sample_statistics():
    gen = torch.Generator().manual_seed(1)
    tables = sample_tables(seed=1)
    target, draft_tokens, draft_probs = rs_rows(tables, gen)
    output, num_accepted = rejection_sample(target, draft_tokens, draft_probs, generator=gen)
    assert 0 < (num_accepted == 2).float().mean() < 1 and (num_accepted == 0).any()
    seq = continue_plain(output, num_accepted, tables[1], tables[2], gen)
    assert min(chi_square_pvalues(seq, *tables[:3])) > ALPHA


def test_target_only_statistics():
    gen = torch.Generator().manual_seed(2)
    p1, p2, p3, q1, q2 = tables = sample_tables(seed=2)
    y1 = q1.argmax().expand(NUM_ROWS)
    y2 = q2[y1].argmax(-1)
    target = torch.stack([p1.expand(NUM_ROWS, JOINT_VOCAB), p2[y1], p3[y1, y2]], dim=1)
    output, num_accepted = rejection_sample(target, torch.stack([y1, y2], dim=1), None, generator=gen)
    seq = continue_plain(output, num_accepted, p2, p3, gen)
    assert min(chi_square_pvalues(seq, p1, p2, p3)) > ALPHA


def test_chi_square_catches_a_wrong_recovery(monkeypatch):
    """Power check: recovering from p instead of max(0, p - q) must fail the same test."""
    gen = torch.Generator().manual_seed(1)
    tables = sample_tables(seed=1)
    target, draft_tokens, draft_probs = rs_rows(tables, gen)
    monkeypatch.setattr(sampling, "recovery_weights", lambda p, tokens, q=None: p.to(torch.float32))
    output, num_accepted = rejection_sample(target, draft_tokens, draft_probs, generator=gen)
    seq = continue_plain(output, num_accepted, tables[1], tables[2], gen)
    assert chi_square_pvalues(seq, *tables[:3])[0] < ALPHA


def test_generator_determinism():
    target, draft_tokens, draft_probs = rs_rows(sample_tables(seed=4), torch.Generator().manual_seed(4))
    target, draft_tokens, draft_probs = target[:256], draft_tokens[:256], draft_probs[:256]
    first = rejection_sample(target, draft_tokens, draft_probs, torch.Generator().manual_seed(9))
    second = rejection_sample(target, draft_tokens, draft_probs, torch.Generator().manual_seed(9))
    assert all(torch.equal(a, b) for a, b in zip(first, second))
    assert first[0].dtype == torch.int64 and first[1].dtype == torch.int64


# ----------------------------------------------------------------------------- logits_to_probs


def test_temperature_scaling():
    logits = torch.tensor([0.0, math.log(2.0)])
    assert torch.allclose(logits_to_probs(logits, 1.0), torch.tensor([1 / 3, 2 / 3]))
    assert torch.allclose(logits_to_probs(logits, 0.5), torch.tensor([1 / 5, 4 / 5]))
    half = 1 / (1 + math.sqrt(2))
    assert torch.allclose(logits_to_probs(logits, 2.0), torch.tensor([half, 1 - half]))


def test_top_k():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    e = torch.exp(torch.tensor([3.0, 2.0]))
    assert torch.allclose(logits_to_probs(logits, 1.0, top_k=2), torch.cat([e / e.sum(), torch.zeros(2)]))
    assert torch.allclose(logits_to_probs(logits, 1.0, top_k=0), torch.softmax(logits, -1))
    assert torch.allclose(logits_to_probs(logits, 1.0, top_k=9), torch.softmax(logits, -1))
    # Ties at the boundary are all kept (docstring example).
    tie = logits_to_probs(torch.tensor([2.0, 1.0, 1.0, 0.0]), 1.0, top_k=2)
    w = torch.tensor([math.e**2, math.e, math.e, 0.0])
    assert torch.allclose(tie, w / w.sum())


def test_top_p_and_order():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(logits_to_probs(logits, 1.0, top_p=0.75), torch.tensor([0.625, 0.375, 0, 0]))
    assert torch.allclose(logits_to_probs(logits, 1.0, top_p=0.85), torch.tensor([0.5, 0.3, 0.15, 0]) / 0.95)
    assert torch.allclose(logits_to_probs(logits, 1.0, top_p=0.4), torch.tensor([1.0, 0, 0, 0]))
    # A tie with the least likely kept token is kept.
    tie = logits_to_probs(torch.log(torch.tensor([0.4, 0.3, 0.3])), 1.0, top_p=0.5)
    assert torch.allclose(tie, torch.tensor([0.4, 0.3, 0.3]))
    # Top-k first, then top-p on the renormalised top-k distribution.
    four = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1]))
    assert torch.allclose(logits_to_probs(four, 1.0, top_k=2, top_p=0.5), torch.tensor([1.0, 0, 0, 0]))
    assert torch.allclose(logits_to_probs(four, 1.0, top_p=0.5), torch.tensor([4 / 7, 3 / 7, 0, 0]))


def test_logits_to_probs_batched():
    logits = torch.randn(3, 4, 50, generator=torch.Generator().manual_seed(0))
    probs = logits_to_probs(logits, 0.7, top_k=10, top_p=0.9)
    assert probs.shape == logits.shape and probs.dtype == torch.float32
    assert torch.allclose(probs.sum(-1), torch.ones(3, 4))
    assert ((probs > 0).sum(-1) <= 10).all() and ((probs > 0).sum(-1) >= 1).all()


def test_logits_to_probs_rejects_bad_settings():
    with pytest.raises(ValueError, match="temperature"):
        logits_to_probs(torch.zeros(4), 0.0)
    with pytest.raises(ValueError, match="top_k"):
        logits_to_probs(torch.zeros(4), 1.0, top_k=-1)
    with pytest.raises(ValueError, match="top_p"):
        logits_to_probs(torch.zeros(4), 1.0, top_p=0.0)
    with pytest.raises(ValueError, match="top_p"):
        logits_to_probs(torch.zeros(4), 1.0, top_p=1.5)
