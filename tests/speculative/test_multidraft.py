"""Tests for bebop.speculative.multidraft: n drafted chains per row, verified losslessly.

Layers, as for the token-wise and block verifiers (the chains and tables of tests/helpers/verification.py):
  * exact: the closed-form output of a verify step with n chains, written here independently of the
    module (numpy residuals), is enumerated over every draft configuration (V = 3..5, n = 2..3,
    K = 1..2) and equals the target's joint to 1e-6; crafted coins pin `accept_multi_draft` to that
    closed form. A rule that tests every round against p (no residual update) fails the enumeration.
  * closed form: `multi_draft_accept_prob` equals the enumerated depth-1 acceptance, equals α_RS at
    n = 1 and never falls as n grows.
  * statistical: chi-square over 1e5 rows of `multi_draft_verify` (n = 2 and 3, K = 2) against the
    target's 3-token joint, 3 p-values each at α = 1e-4: an exact sampler fails this file with odds at
    most 6e-4 (union bound) for a seed picked at random; seeds are fixed, so a checkout passes or fails
    deterministically.
  * literal: n = 1 equals token-wise verification bit for bit; the docstring examples; input errors.
"""

import itertools
import math

import numpy as np
import pytest
import torch

from bebop.speculative.multidraft import (
    accept_multi_draft,
    multi_draft_accept_prob,
    multi_draft_expected_accepts,
    multi_draft_verify,
    residuals,
    verify_multi_draft_from_noise,
    verify_multi_draft_keyed,
)
from bebop.speculative.sampling import accept_token_wise, verify_distributions
from bebop.speculative.verification import verify_from_noise
from tests.helpers.verification import (
    ALPHA,
    CASES,
    EXACT_ATOL,
    JOINT_VOCAB,
    NUM_ROWS,
    chain_for,
    chi_square_pvalues,
    continue_plain,
    emitted_joint,
    sample_tables,
    target_joint,
)


def _np_rounds(p: np.ndarray, q: np.ndarray, n: int, update: bool = True) -> tuple[list, np.ndarray]:
    """Round targets r_0..r_{n-1} and the final residual r_n, normalised (numpy, independent of the module)."""
    rounds, r = [], p
    for _ in range(n):
        rounds.append(r)
        if update:
            w = np.maximum(r - q, 0.0)
            r = w / w.sum() if w.sum() > 0 else r
    return rounds, r


def _accept(r: np.ndarray, q: np.ndarray, token: int) -> float:
    return min(1.0, r[token] / q[token]) if q[token] > 0 else float(r[token] > 0)


def multi_draft_joint(chain, vocab: int, n: int, k: int, update: bool = True) -> np.ndarray:
    """Distribution of the first K+1 tokens emitted by one multi-draft step (then plain decoding),
    summed over every draft configuration: n first tokens i.i.d. from q_1, each chain continued by Q."""
    p1, q1 = chain.p(()), chain.q(())
    joint = np.zeros((vocab,) * (k + 1))
    firsts = list(itertools.product(range(vocab), repeat=n))
    tails = list(itertools.product(range(vocab), repeat=k - 1))
    rounds, final = _np_rounds(p1, q1, n, update)
    for first in firsts:
        weight_first = math.prod(q1[x] for x in first)
        if weight_first == 0:
            continue
        accepts = [_accept(rounds[i], q1, first[i]) for i in range(n)]
        pick = [math.prod(1 - a for a in accepts[:c]) * accepts[c] for c in range(n)]
        none = math.prod(1 - a for a in accepts)
        # No chain kept: the continuations do not matter; the row emits from the final residual.
        reject = emitted_joint(chain, (first[0],) + (0,) * (k - 1), [0.0] + [0.0] * (k - 1), [final] + [p1] * k, vocab)
        joint += weight_first * none * reject
        for c in range(n):
            if pick[c] == 0:
                continue
            for tail in tails:
                drafts = (first[c],) + tail
                weight_tail = math.prod(chain.q(drafts[:j])[drafts[j]] for j in range(1, k))
                if weight_tail == 0:
                    continue
                accept, resample = _token_wise_closed_form(chain, drafts, vocab)
                joint += weight_first * pick[c] * weight_tail * emitted_joint(
                    chain, drafts, [1.0] + accept[1:], resample, vocab)
    return joint


def _token_wise_closed_form(chain, drafts, vocab):
    k = len(drafts)
    target = torch.tensor(np.array([[chain.p(drafts[:j]) for j in range(k + 1)]]), dtype=torch.float64)
    draft_probs = torch.tensor(np.array([[chain.q(drafts[:j]) for j in range(k)]]), dtype=torch.float64)
    accept, resample = verify_distributions(target, torch.tensor([drafts]), draft_probs)
    return accept[0].tolist(), resample[0].numpy()


ENUMERATION = [(name, pair, vocab, n, k) for name, pair, vocab in CASES for n, k in ((2, 1), (2, 2), (3, 1))
               if vocab ** (n + n * (k - 1)) <= 5**4]


@pytest.mark.parametrize("name,pair,vocab,n,k", ENUMERATION, ids=[f"{c[0]}-n{c[3]}-k{c[4]}" for c in ENUMERATION])
def test_enumerated_output_is_the_target(name, pair, vocab, n, k):
    chain = chain_for(pair, vocab)
    got = multi_draft_joint(chain, vocab, n, k)
    np.testing.assert_allclose(got, target_joint(chain, vocab, k + 1), atol=EXACT_ATOL)


def test_rounds_without_the_residual_update_are_not_exact():
    """Testing every round against p (a plausible mistake) emits too much of the likely tokens."""
    name, pair, vocab = next(c for c in CASES if c[0] == "random_v3_0")
    chain = chain_for(pair, vocab)
    wrong = multi_draft_joint(chain, vocab, 2, 1, update=False)
    assert np.abs(wrong - target_joint(chain, vocab, 2)).max() > 1e-3


def _step_inputs(chain, firsts, tails, dtype=torch.float64):
    """One row: chains (first[c],) + tails[c], with target and draft rows along each."""
    drafts = [(f,) + t for f, t in zip(firsts, tails)]
    k = len(drafts[0])
    target = torch.tensor([[[chain.p(d[:j]) for j in range(k + 1)] for d in drafts]], dtype=dtype)
    draft_probs = torch.tensor([[[chain.q(d[:j]) for j in range(k)] for d in drafts]], dtype=dtype)
    return target, torch.tensor([drafts]), draft_probs


@pytest.mark.parametrize("name,pair,vocab", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_crafted_coins_follow_the_closed_form(name, pair, vocab):
    """Coins just below a round's threshold accept it, just above reject it; the emitted weights
    are the final residual or the picked chain's token-wise weights."""
    chain = chain_for(pair, vocab)
    p1, q1 = chain.p(()), chain.q(())
    support = [v for v in range(vocab) if q1[v] > 0]
    firsts, tails = (support[0], support[-1]), ((support[0],), (support[-1],))
    target, drafts, draft_probs = _step_inputs(chain, firsts, tails)
    rounds, final = _np_rounds(p1, q1, 2)
    thresholds = [_accept(rounds[i], q1, firsts[i]) for i in range(2)]
    eps = 1e-9
    for c0, c1, kept in ((thresholds[0] - eps, 0.5, 0), (thresholds[0] + eps, thresholds[1] - eps, 1),
                         (thresholds[0] + eps, thresholds[1] + eps, None)):
        if not (0 < c0 < 1 and 0 < c1 < 1):
            continue
        uniform = torch.tensor([[c0, c1, 1 - eps]], dtype=torch.float64)
        chain_index, num_accepted, weights = accept_multi_draft(target, drafts, draft_probs, uniform)
        if kept is None:
            assert num_accepted.item() == 0
            np.testing.assert_allclose(weights[0].numpy() / weights[0].sum().item(), final, atol=EXACT_ATOL)
        else:
            assert chain_index.item() == kept and num_accepted.item() >= 1
            deeper, expected = accept_token_wise(target[:, kept, 1:], drafts[:, kept, 1:], draft_probs[:, kept, 1:],
                                                 uniform[:, 2:])
            assert num_accepted.item() == 1 + deeper.item()
            torch.testing.assert_close(weights, expected)


def test_one_chain_equals_token_wise_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    batch, k, vocab = 400, 3, 7
    p = torch.softmax(torch.randn(batch, k + 1, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(batch, k, vocab, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.view(-1, vocab), 1, generator=gen).view(batch, k)
    coins = torch.rand(batch, k, generator=gen, dtype=torch.float64)
    race = torch.empty(batch, vocab).exponential_(generator=gen)
    from bebop.speculative.verification import VERIFIERS
    expected, expected_accepted = verify_from_noise(VERIFIERS["token"], p, drafts, q, coins, race)
    chain, got, got_accepted = verify_multi_draft_from_noise(p[:, None], drafts[:, None], q[:, None], coins, race)
    assert torch.equal(got, expected) and torch.equal(got_accepted, expected_accepted)
    assert (chain == 0).all()


def test_keyed_step_equals_the_step_over_its_noise_drawn_whole():
    """The engine's `verify_multi_draft_keyed` is `verify_multi_draft_from_noise` given the rows' coin and
    race streams (`verification.noise_keys`) drawn whole, token for token."""
    from bebop.speculative import rng
    from bebop.speculative.verification import STREAM_ACCEPT, STREAM_RESAMPLE, noise_keys

    gen = torch.Generator().manual_seed(4)
    batch, n, k, vocab = 300, 3, 2, 9
    p = torch.softmax(torch.randn(batch, n, k + 1, vocab, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(batch, n, k, vocab, generator=gen) * 2, -1)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).view(batch, n, k)
    seeds, counters = rng.derive_seeds(2, 1, torch.arange(batch)), torch.arange(batch) % 11
    coins = rng.uniform(seeds, STREAM_ACCEPT, counters, (n + k - 1,), torch.float64)
    race = rng.exponential(seeds, STREAM_RESAMPLE, counters, (vocab,))
    got = verify_multi_draft_keyed(p, drafts, q, noise_keys(seeds, k), counters)
    want = verify_multi_draft_from_noise(p, drafts, q, coins, race)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(set(got[0].tolist())) == n  # every chain is kept somewhere


def test_docstring_examples():
    p, q = torch.tensor([0.2, 0.8]), torch.tensor([0.5, 0.5])
    rounds, final = residuals(p, q, 2)
    torch.testing.assert_close(rounds, torch.tensor([[0.2, 0.8], [0.0, 1.0]]))
    torch.testing.assert_close(final, torch.tensor([0.0, 0.5]))
    assert multi_draft_accept_prob(p, q, 1).item() == pytest.approx(0.7)
    assert multi_draft_accept_prob(p, q, 2).item() == pytest.approx(0.85)
    target = torch.stack([p, p])[None, :, None].expand(1, 2, 2, 2)  # K = 1: rows p_1, p_2 = p
    draft_probs = q.expand(1, 2, 1, 2)
    chain, num_accepted, weights = accept_multi_draft(target, torch.tensor([[[0], [0]]]), draft_probs,
                                                      torch.tensor([[0.5, 0.1]], dtype=torch.float64))
    assert num_accepted.item() == 0 and chain.item() == 0
    torch.testing.assert_close(weights, torch.tensor([[0.0, 0.5]]))


@pytest.mark.parametrize("name,pair,vocab", CASES, ids=[c[0] for c in CASES])
def test_accept_prob_is_the_enumerated_one_and_grows_with_n(name, pair, vocab):
    chain = chain_for(pair, vocab)
    p1, q1 = chain.p(()), chain.q(())
    previous = 0.0
    for n in (1, 2, 3):
        rounds, _ = _np_rounds(p1, q1, n)
        enumerated = 0.0
        for first in itertools.product(range(vocab), repeat=n):
            accepts = [_accept(rounds[i], q1, first[i]) for i in range(n)]
            enumerated += math.prod(q1[x] for x in first) * (1 - math.prod(1 - a for a in accepts))
        got = multi_draft_accept_prob(torch.tensor(p1), torch.tensor(q1), n).item()
        assert got == pytest.approx(enumerated, abs=EXACT_ATOL)
        assert got >= previous - EXACT_ATOL
        previous = got
    alpha_rs = np.minimum(p1, q1).sum()
    assert multi_draft_accept_prob(torch.tensor(p1), torch.tensor(q1), 1).item() == pytest.approx(alpha_rs)


def _multi_rows(tables, n: int, gen: torch.Generator):
    """NUM_ROWS rows of n chains (K = 2): first tokens i.i.d. from Q1, seconds from Q2[first]."""
    p1, p2, p3, q1, q2 = tables
    first = torch.multinomial(q1, NUM_ROWS * n, replacement=True, generator=gen).view(NUM_ROWS, n)
    second = torch.multinomial(q2[first.reshape(-1)], 1, generator=gen).view(NUM_ROWS, n)
    target = torch.stack([p1.expand(NUM_ROWS, n, JOINT_VOCAB), p2[first], p3[first, second]], dim=2)  # (N, n, 3, V)
    draft_probs = torch.stack([q1.expand(NUM_ROWS, n, JOINT_VOCAB), q2[first]], dim=2)  # (N, n, 2, V)
    return target, torch.stack([first, second], dim=2), draft_probs


@pytest.mark.parametrize("n,seed", [(2, 11), (3, 12)])
def test_chi_square_against_the_target_joint(n, seed):
    tables = sample_tables(seed)
    gen = torch.Generator().manual_seed(seed)
    target, drafts, draft_probs = _multi_rows(tables, n, gen)
    _, output, num_accepted = multi_draft_verify(target, drafts, draft_probs, generator=gen)
    seq = continue_plain(output, num_accepted, tables[1], tables[2], gen)
    pvalues = chi_square_pvalues(seq, tables[0], tables[1], tables[2])
    assert min(pvalues) > ALPHA, pvalues
    # More chains accept more: the depth-1 rate is the closed form's (5 sigma of a binomial).
    expected = multi_draft_accept_prob(tables[0], tables[3], n).item()
    observed = (num_accepted >= 1).double().mean().item()
    assert abs(observed - expected) < 5 * math.sqrt(expected * (1 - expected) / NUM_ROWS) + 1e-9


def test_input_errors():
    p = torch.full((1, 2, 3, 4), 0.25)
    q = torch.full((1, 2, 2, 4), 0.25)
    drafts = torch.zeros(1, 2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="draft's distribution"):
        accept_multi_draft(p, drafts, None, torch.full((1, 3), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="uniform"):
        accept_multi_draft(p, drafts, q, torch.full((1, 2), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="draft_tokens"):
        accept_multi_draft(p, drafts[:, :1], q, torch.full((1, 3), 0.5, dtype=torch.float64))
    with pytest.raises(ValueError, match="num_drafts"):
        multi_draft_accept_prob(p[0, 0, 0], q[0, 0, 0], 0)


def test_expected_accepts_with_one_draft_are_the_chain_sum():
    gen = torch.Generator().manual_seed(4)
    p = torch.softmax(torch.randn(50, 6, generator=gen) * 2, -1)
    q = torch.softmax(torch.randn(50, 6, generator=gen) * 2, -1)
    alpha = torch.rand(50, 3, generator=gen, dtype=torch.float64)
    alpha[:, 0] = torch.minimum(p, q).sum(-1)
    torch.testing.assert_close(multi_draft_expected_accepts(p, q, alpha, 1), alpha.cumprod(1).sum(1))
    assert (multi_draft_expected_accepts(p, q, alpha, 2) >= alpha.cumprod(1).sum(1) - 1e-6).all()
    example = multi_draft_expected_accepts(torch.tensor([[0.2, 0.8]]), torch.tensor([[0.5, 0.5]]),
                                           torch.tensor([[0.7, 0.5]]), 2)
    assert example.item() == pytest.approx(1.275)
