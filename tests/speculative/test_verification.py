"""Tests for bebop.speculative.verification: the one shape both verifiers share (checks, noise, output).

  * statistical: the engine's path for each verifier in `VERIFIERS`: drafts drawn with
    `sampling.keyed_race` on the draft streams, verified with `verify_keyed`, chi-square over 1e5
    rows against the target's joint. α = 1e-4 per check, 3 checks per verifier, 6 in all, so a
    correct implementation fails the file with odds at most 6e-4 (union bound) for a seed picked at
    random; seeds are fixed, so a given checkout passes or fails deterministically.
  * literal: the noise streams (`verify_keyed` equals `verify_from_noise` on the streams' noise drawn whole),
    batch independence, greedy cases, one-hot targets and K = 0 for both verifiers, and input validation
    written by hand.
"""

import pytest
import torch

from bebop.speculative.settings import VERIFY_CHOICES
from bebop.speculative import rng
from bebop.speculative.sampling import PAD_TOKEN_ID, keyed_race, sample_from_probs
from bebop.speculative.verification import (
    STREAM_ACCEPT,
    STREAM_DRAFT,
    STREAM_RESAMPLE,
    VERIFIERS,
    block_verify,
    draw_coins,
    greedy_verify,
    noise_keys,
    rejection_sample,
    verify_from_noise,
    verify_keyed,
)
from tests.helpers.verification import (
    ALPHA,
    JOINT_VOCAB,
    NUM_ROWS,
    chi_square_pvalues,
    continue_plain,
    one_hot_case,
    sample_tables,
)


def test_verifiers_are_the_verify_choices():
    assert tuple(VERIFIERS) == VERIFY_CHOICES


# ----------------------------------------------------------------------------- noise


def test_noise_follows_the_stream_layout():
    """The engine's draws are `rng`'s streams at the rows' counters: coins STREAM_ACCEPT, the emitted token's
    race STREAM_RESAMPLE, draft step j STREAM_DRAFT + j (the column of `noise_keys` is the stream); K may
    exceed V. `verify_keyed` equals `verify_from_noise` given those streams' noise drawn whole."""
    seeds = rng.derive_seeds(4, 2, torch.arange(6))
    counters = torch.tensor([0, 3, 3, 9, 1, 40])
    keys = noise_keys(seeds, 3)
    for k, vocab in ((3, 11), (3, 2)):
        coins = draw_coins(keys, counters, k)
        assert torch.equal(coins, rng.uniform(seeds, STREAM_ACCEPT, counters, (k,), torch.float64))
        weights = torch.rand(6, vocab, generator=torch.Generator().manual_seed(vocab))
        for stream in [STREAM_RESAMPLE] + [STREAM_DRAFT + j for j in range(k)]:
            race = rng.exponential(seeds, stream, counters, (vocab,))
            key = rng.counter_keys(keys[:, stream: stream + 1], counters)[:, 0]
            assert torch.equal(keyed_race(weights, key), sample_from_probs(weights, race))
        p = torch.softmax(torch.randn(6, k + 1, vocab, generator=torch.Generator().manual_seed(1)), -1)
        q = torch.softmax(torch.randn(6, k, vocab, generator=torch.Generator().manual_seed(2)), -1)
        drafts = torch.randint(0, vocab, (6, k), generator=torch.Generator().manual_seed(3))
        race = rng.exponential(seeds, STREAM_RESAMPLE, counters, (vocab,))
        for verifier in VERIFIERS.values():
            got = verify_keyed(verifier, p, drafts, q, keys, counters)
            want = verify_from_noise(verifier, p, drafts, q, coins, race)
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def _engine_path(tables, verify: str):
    """1e5 rows the way the engine runs them: drafts by `keyed_race` on the draft streams, then one verify step."""
    p1, p2, p3, q1, q2 = tables
    seeds = rng.derive_seeds(0, 0, torch.arange(NUM_ROWS))
    counters = torch.full((NUM_ROWS,), 17, dtype=torch.int64)
    keys = noise_keys(seeds, 2)
    draft_keys = rng.counter_keys(keys[:, STREAM_DRAFT: STREAM_DRAFT + 2], counters)
    y1 = keyed_race(q1.expand(NUM_ROWS, JOINT_VOCAB), draft_keys[:, 0])
    y2 = keyed_race(q2[y1], draft_keys[:, 1])
    target = torch.stack([p1.expand(NUM_ROWS, JOINT_VOCAB), p2[y1], p3[y1, y2]], dim=1)  # (N, 3, V)
    draft_tokens = torch.stack([y1, y2], dim=1)
    draft_probs = torch.stack([q1.expand(NUM_ROWS, JOINT_VOCAB), q2[y1]], dim=1)

    def run(rows=slice(None)):
        return verify_keyed(VERIFIERS[verify], target[rows], draft_tokens[rows], draft_probs[rows], keys[rows],
                            counters[rows])

    return run


@pytest.mark.parametrize("verify", list(VERIFIERS))
def test_engine_path_statistics_and_batch_independence(verify):
    """The noise functions and verifier the engine calls emit the target's joint; a row's result is the
    same on every call and does not depend on the rows around it."""
    p1, p2, p3, _, _ = tables = sample_tables(seed=3)
    run = _engine_path(tables, verify)
    output, num_accepted = run()
    assert (num_accepted == 0).any() and (num_accepted == 2).any()
    seq = continue_plain(output, num_accepted, p2, p3, torch.Generator().manual_seed(3))
    assert min(chi_square_pvalues(seq, p1, p2, p3)) > ALPHA
    again = run()
    assert torch.equal(again[0], output) and torch.equal(again[1], num_accepted)
    for rows in (slice(5, 6), slice(1000, 1064)):
        sub_out, sub_num = run(rows)
        assert torch.equal(sub_out, output[rows]) and torch.equal(sub_num, num_accepted[rows])


# ----------------------------------------------------------------------------- output


@pytest.mark.parametrize("verify_op, use_q", [(rejection_sample, True), (rejection_sample, False), (block_verify, True)],
                         ids=["token-rs", "token-to", "block"])
def test_one_hot_target_reduces_to_greedy(verify_op, use_q):
    """With p one-hot at the argmax, every verifier gives exactly greedy_verify's output."""
    logits, p, q, drafts, gen = one_hot_case()
    expected = greedy_verify(logits, drafts)
    got = verify_op(p, drafts, q if use_q else None, generator=gen)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("verify", list(VERIFIERS))
def test_zero_draft_tokens_is_plain_sampling(verify):
    p = torch.tensor([[[0.1, 0.0, 0.9]], [[0.0, 1.0, 0.0]]])  # (B=2, K+1=1, V=3)
    race = torch.tensor([[1.0, 1.0, 1.0], [0.1, 5.0, 0.1]])
    for q in ((None, torch.zeros(2, 0, 3)) if verify == "token" else (torch.zeros(2, 0, 3),)):
        output, num_accepted = verify_from_noise(VERIFIERS[verify], p, torch.zeros(2, 0, dtype=torch.int64), q,
                                                 torch.zeros(2, 0), race)
        assert output.tolist() == [[2], [1]] and num_accepted.tolist() == [0, 0]


def _logits_with_argmax(argmax_rows, vocab=6):
    """(B, K+1, V) logits, negative everywhere, highest at the given token ids."""
    ids = torch.tensor(argmax_rows)
    logits = -5.0 - torch.arange(vocab, dtype=torch.float32).expand(*ids.shape, vocab).clone()
    logits.scatter_(-1, ids[..., None], 3.0)
    return logits


def test_greedy_literal_cases():
    logits = _logits_with_argmax([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    drafts = torch.tensor([[1, 2], [4, 2], [1, 5]])  # accept all; mismatch at step 1; at step 2
    output, num_accepted = greedy_verify(logits, drafts)
    assert output.tolist() == [[1, 2, 3], [1, PAD_TOKEN_ID, PAD_TOKEN_ID], [1, 2, PAD_TOKEN_ID]]
    assert num_accepted.tolist() == [2, 0, 1]
    # Probabilities give the same answer as logits; K = 0 is plain greedy decoding.
    assert torch.equal(greedy_verify(torch.softmax(logits, -1), drafts)[0], output)
    out0, num0 = greedy_verify(_logits_with_argmax([[4]]), torch.zeros(1, 0, dtype=torch.int64))
    assert out0.tolist() == [[4]] and num0.tolist() == [0]
    # Ties go to the lowest token id.
    tied = torch.tensor([[[0.0, 1.0, 1.0]]])
    assert greedy_verify(tied, torch.zeros(1, 0, dtype=torch.int64))[0].item() == 1


# ----------------------------------------------------------------------------- validation


def _valid_inputs():
    p = torch.full((2, 3, 4), 0.25)
    return p, torch.zeros(2, 2, dtype=torch.int64), torch.full((2, 2, 4), 0.25)


@pytest.mark.parametrize("verify_op", [rejection_sample, block_verify], ids=["token", "block"])
@pytest.mark.parametrize("change, match", [
    (lambda p, t, q: (p.index_put_((torch.tensor(0),), torch.tensor(float("nan"))), t, q), "NaN"),
    (lambda p, t, q: (p * torch.tensor([1.0, -1.0, 1.0, 1.0]), t, q), "negative"),
    (lambda p, t, q: (p * 2, t, q), "sum to 1"),
    (lambda p, t, q: (p, t, q.clone().fill_(float("nan"))), "draft_probs contains NaN"),
    (lambda p, t, q: (p, t.int(), q), "int64"),
    (lambda p, t, q: (p, t[:, :1], q), r"\(B, K\)"),
    (lambda p, t, q: (p, t, q[:, :1]), "draft_probs must have shape"),
    (lambda p, t, q: (p[0], t, q), "K\\+1"),
    (lambda p, t, q: (p, t + 4, q), r"\[0, 4\)"),
    (lambda p, t, q: (p.long(), t, q), "floating-point"),
])
def test_verify_ops_reject_bad_inputs(verify_op, change, match):
    with pytest.raises(ValueError, match=match):
        verify_op(*change(*_valid_inputs()), generator=torch.Generator().manual_seed(0))


def test_noise_and_greedy_validation():
    p, t, q = _valid_inputs()
    coins, race = torch.full((2, 2), 0.5), torch.ones(2, 4)
    for verifier in VERIFIERS.values():
        verify_from_noise(verifier, p, t, q, coins, race)  # valid
        with pytest.raises(ValueError, match="uniform noise"):
            verify_from_noise(verifier, p, t, q, torch.ones(2, 2), race)
        with pytest.raises(ValueError, match="exponential noise"):
            verify_from_noise(verifier, p, t, q, coins, torch.zeros(2, 4))
        with pytest.raises(ValueError, match="uniform must have shape"):
            verify_from_noise(verifier, p, t, q, coins[:, :1], race)
    with pytest.raises(ValueError, match="NaN"):
        greedy_verify(torch.full((2, 3, 4), float("nan")), t)
