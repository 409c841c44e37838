"""Tests for bebop.rl.grpo: advantages, sequence logprobs, micro-batches, the clipped loss and k3 KL."""

import pytest
import torch
from torch.nn import functional as F

from bebop.rl.grpo import group_advantages, kl_k3, micro_batches, policy_loss
from bebop.rollout.logprobs import pad_sequences, token_logprobs
from tests.helpers.rl import sequence_logprobs

# ---------------------------------------------------------------- group_advantages


def test_advantages_hand_case():
    # mean 0.5, population std 0.5 -> (r - 0.5) / 0.5 = ±1
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4, eps=0.0)
    torch.testing.assert_close(adv, torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_advantages_groups_are_prompt_major_and_independent():
    rewards = torch.tensor([1.0, 0.0, 5.0, 5.0, 2.0, 4.0])  # three prompts, G = 2
    adv = group_advantages(rewards, group_size=2)
    expected = torch.tensor([1.0, -1.0, 0.0, 0.0, -1.0, 1.0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)


def test_zero_variance_group_gives_zeros():
    adv = group_advantages(torch.tensor([3.0, 3.0, 3.0, 0.0, 1.0, 0.0]), group_size=3)
    assert torch.equal(adv[:3], torch.zeros(3))
    assert torch.isfinite(adv).all()


def test_mean_only_advantages():
    adv = group_advantages(torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 4.0]), group_size=3, scale=False)
    torch.testing.assert_close(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, -2.0, 0.0, 2.0]))


def test_advantages_match_population_std_formula():
    rewards = torch.rand(4 * 8, generator=torch.Generator().manual_seed(0))
    grouped = rewards.view(4, 8)
    std = grouped.std(1, unbiased=False, keepdim=True)
    expected = (grouped - grouped.mean(1, keepdim=True)) / (std + 1e-6)
    torch.testing.assert_close(group_advantages(rewards, 8), expected.reshape(-1))


@pytest.mark.parametrize("shape, group_size", [((6,), 4), ((2, 3), 3), ((4,), 0)])
def test_advantages_reject_bad_inputs(shape, group_size):
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(shape), group_size)


def test_sequence_logprobs_is_row_sum_and_has_grad():
    from tests.helpers.models import tiny_model

    tiny_lm = tiny_model("qwen3", vocab_size=64).requires_grad_(True)
    ids, attn, comp = pad_sequences([[3, 17], [4]], [[9, 22], [5, 6, 7]], pad_id=0)
    per_token = token_logprobs(tiny_lm, ids, attn, comp)
    total = sequence_logprobs(tiny_lm, ids, attn, comp)
    torch.testing.assert_close(total, per_token.sum(1))
    total.sum().backward()
    grads = [p.grad for p in tiny_lm.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    tiny_lm.zero_grad(set_to_none=True)


def test_micro_batches_cover_every_row_within_the_budget():
    assert micro_batches([3, 3, 5, 2], max_tokens=10) == [slice(0, 2), slice(2, 4)]
    assert micro_batches([12, 2, 2], max_tokens=10) == [slice(0, 1), slice(1, 3)]  # too long: alone
    assert micro_batches([], max_tokens=10) == []
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 40, (200,), generator=g).tolist()
    groups = micro_batches(lengths, max_tokens=64)
    assert [r for s in groups for r in range(s.start, s.stop)] == list(range(200))
    for s in groups:
        rows = lengths[s]
        assert len(rows) * max(rows) <= 64
        if s.stop < 200:  # closed because the next row did not fit
            assert (len(rows) + 1) * max(rows + [lengths[s.stop]]) > 64
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        micro_batches([3], max_tokens=0)


# ---------------------------------------------------------------- policy_loss and kl_k3


def test_policy_loss_ratio_one_is_token_weighted_advantage():
    # Row 0: 3 valid tokens with A = 1; row 1: 1 valid token with A = -1.
    logprobs = torch.full((2, 4), -1.0, requires_grad=True)
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 0]], dtype=torch.bool)
    old = logprobs.detach().clone()
    loss, metrics = policy_loss(logprobs, old, torch.tensor([1.0, -1.0]), mask)
    torch.testing.assert_close(loss, torch.tensor(-(3 * 1.0 + 1 * -1.0) / 4))
    assert metrics["rl/ratio_mean"] == pytest.approx(1.0)
    assert metrics["rl/clip_fraction"] == 0.0 and metrics["rl/kl"] == 0.0
    loss.backward()
    # d loss / d logp = -A * ratio / num_tokens on valid tokens, 0 elsewhere.
    expected = torch.tensor([[-1, -1, -1, 0], [0, 1, 0, 0]], dtype=torch.float32) / 4
    torch.testing.assert_close(logprobs.grad, expected)


def test_policy_loss_clipping_hand_case():
    # One token per row, eps = 0.2. Ratios 1.5 and 0.5 with A = +1 and A = -1.
    ratios = torch.tensor([1.5, 0.5, 1.5, 0.5])
    advantages = torch.tensor([1.0, 1.0, -1.0, -1.0])
    logprobs = ratios.log().unsqueeze(1).clone().requires_grad_(True)  # (4, 1)
    old = torch.zeros(4, 1)
    mask = torch.ones(4, 1, dtype=torch.bool)
    loss, metrics = policy_loss(logprobs, old, advantages, mask, clip_eps=0.2)
    # min(rA, clip(r)A): row0 min(1.5, 1.2) = 1.2 (clipped); row1 min(0.5, 0.8) = 0.5;
    # row2 min(-1.5, -1.2) = -1.5;  row3 min(-0.5, -0.8) = -0.8 (clipped).
    torch.testing.assert_close(loss, torch.tensor(-(1.2 + 0.5 - 1.5 - 0.8) / 4))
    assert metrics["rl/clip_fraction"] == pytest.approx(0.5)
    assert metrics["rl/ratio_mean"] == pytest.approx(1.0)
    loss.backward()
    # Clipped rows get no gradient; the others get -A * r / N.
    torch.testing.assert_close(logprobs.grad[:, 0], torch.tensor([0.0, -0.5 / 4, 1.5 / 4, 0.0]))


def test_policy_loss_matches_naive_reference_with_kl():
    gen = torch.Generator().manual_seed(1)
    logprobs = (-torch.rand(3, 5, generator=gen) * 3).requires_grad_(True)
    old = logprobs.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    ref = logprobs.detach() + 0.3 * torch.randn(3, 5, generator=gen)
    adv = torch.randn(3, generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.3
    loss, metrics = policy_loss(
        logprobs, old, adv, mask, clip_eps=0.2, ref_logprobs=ref, kl_coef=0.1
    )

    naive_lp = logprobs.detach().clone().requires_grad_(True)
    terms, kls = [], []
    for b in range(3):
        for t in range(5):
            if mask[b, t]:
                r = torch.exp(naive_lp[b, t] - old[b, t])
                terms.append(torch.minimum(r * adv[b], r.clamp(0.8, 1.2) * adv[b]))
                d = ref[b, t] - naive_lp[b, t]
                kls.append(torch.exp(d) - d - 1)
    naive = -torch.stack(terms).mean() + 0.1 * torch.stack(kls).mean()
    torch.testing.assert_close(loss, naive)
    assert metrics["rl/kl"] == pytest.approx(torch.stack(kls).mean().item(), rel=1e-5)
    loss.backward()
    naive.backward()
    torch.testing.assert_close(logprobs.grad, naive_lp.grad)


def test_policy_loss_gradient_flows_only_through_logprobs():
    logprobs = torch.randn(2, 3).requires_grad_(True)
    old = torch.randn(2, 3).requires_grad_(True)
    ref = torch.randn(2, 3).requires_grad_(True)
    adv = torch.randn(2).requires_grad_(True)
    loss, _ = policy_loss(logprobs, old, adv, torch.ones(2, 3), ref_logprobs=ref, kl_coef=0.5)
    loss.backward()
    assert logprobs.grad is not None and logprobs.grad.abs().sum() > 0
    assert old.grad is None and ref.grad is None and adv.grad is None


def test_policy_loss_empty_mask_is_zero_not_nan():
    logprobs = torch.randn(2, 3, requires_grad=True)
    mask = torch.zeros(2, 3, dtype=torch.bool)
    loss, metrics = policy_loss(logprobs, logprobs.detach(), torch.ones(2), mask)
    assert loss.item() == 0.0 and all(v == v for v in metrics.values())


def test_policy_loss_rejects_bad_inputs():
    lp = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="advantages must be"):
        policy_loss(lp, lp, torch.zeros(3), torch.ones(2, 3))
    with pytest.raises(ValueError, match="mask shape"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 4))
    with pytest.raises(ValueError, match="needs ref_logprobs"):
        policy_loss(lp, lp, torch.zeros(2), torch.ones(2, 3), kl_coef=0.1)


def test_kl_k3_nonnegative_and_zero_when_equal():
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(4, 7, generator=gen), torch.randn(4, 7, generator=gen)
    assert torch.all(kl_k3(a, b) >= 0)
    assert torch.equal(kl_k3(a, a), torch.zeros(4, 7))
    # hand value: logp = 0, ref = log 2 -> 2 - log 2 - 1
    log2 = torch.tensor([[2.0]]).log()
    torch.testing.assert_close(kl_k3(torch.zeros(1, 1), log2), 1.0 - log2)


def test_kl_k3_is_unbiased_for_the_true_kl():
    # Sample tokens from p, average k3 against q: should approach KL(p || q).
    gen = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(6, generator=gen), 0)
    q = torch.softmax(torch.randn(6, generator=gen), 0)
    tokens = torch.multinomial(p, 200_000, replacement=True, generator=gen)
    estimate = kl_k3(p.log()[tokens], q.log()[tokens]).mean()
    exact = (p * (p.log() - q.log())).sum()
    torch.testing.assert_close(estimate, exact, atol=0.02, rtol=0.0)


def test_docstring_examples():
    import doctest

    import bebop.rl.grpo

    assert doctest.testmod(bebop.rl.grpo).failed == 0
