"""Tests for bebop.rl.grpo: advantages, padding, token logprobs, the clipped loss and k3 KL."""

import pytest
import torch
from torch.nn import functional as F

from bebop.rl import grpo
from bebop.rl.grpo import (
    group_advantages,
    kl_k3,
    lm_head_of,
    micro_batches,
    pad_sequences,
    policy_loss,
    sequence_logprobs,
    token_logprobs,
)

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


# ---------------------------------------------------------------- pad_sequences


def test_pad_sequences_right_pads():
    ids, attn, comp = pad_sequences([[5, 6], [7], [1, 2, 3]], [[8], [9, 4, 2], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 8, 0], [7, 9, 4, 2], [1, 2, 3, 0]]
    assert attn.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert comp.tolist() == [
        [False, False, True, False],
        [False, True, True, True],
        [False, False, False, False],
    ]
    assert ids.dtype == attn.dtype == torch.long and comp.dtype == torch.bool


def test_pad_sequences_rejects_bad_rows():
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        pad_sequences([[1], [2]], [[3]], pad_id=0)
    with pytest.raises(ValueError, match="row 1 has an empty prompt"):
        pad_sequences([[1], []], [[3], [4]], pad_id=0)


# ---------------------------------------------------------------- token_logprobs


@pytest.fixture(scope="module")
def tiny_lm():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config).eval()


def _manual_logprobs(model, ids, num_prompt, temperature=1.0):
    """Naive reference for one unpadded row: log_softmax(logits[t-1] / temp)[token t]."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0] / temperature  # (T, V)
    logp = F.log_softmax(logits.float(), dim=-1)
    out = torch.zeros(len(ids))
    for t in range(num_prompt, len(ids)):
        out[t] = logp[t - 1, ids[t]]
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_manual(tiny_lm, temperature):
    prompt, completion = [3, 17, 4], [9, 22, 41, 5]
    ids, attn, comp = pad_sequences([prompt], [completion], pad_id=0)
    with torch.no_grad():
        got = token_logprobs(tiny_lm, ids, attn, comp, temperature=temperature)
    expected = _manual_logprobs(tiny_lm, prompt + completion, len(prompt), temperature)
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-5)
    assert torch.all(got[0, : len(prompt)] == 0)
    assert torch.all(got[0, len(prompt) :] < 0)


def test_padding_does_not_change_real_token_logprobs(tiny_lm):
    prompts = [[3, 17], [8, 1, 2, 6, 30], [11]]
    completions = [[9, 22], [41, 5, 7, 7], [2, 3, 4, 5, 6, 7, 8]]
    ids, attn, comp = pad_sequences(prompts, completions, pad_id=49)
    assert (attn == 0).any(), "the batch must contain padding for this test to mean anything"
    with torch.no_grad():
        batched = token_logprobs(tiny_lm, ids, attn, comp)
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            alone = token_logprobs(tiny_lm, *pad_sequences([prompt], [completion], pad_id=49))
            n = len(prompt) + len(completion)
            torch.testing.assert_close(batched[row, :n], alone[0], atol=1e-5, rtol=1e-5)
            assert torch.all(batched[row, n:] == 0)


def test_sequence_logprobs_is_row_sum_and_has_grad(tiny_lm):
    ids, attn, comp = pad_sequences([[3, 17], [4]], [[9, 22], [5, 6, 7]], pad_id=0)
    per_token = token_logprobs(tiny_lm, ids, attn, comp)
    total = sequence_logprobs(tiny_lm, ids, attn, comp)
    torch.testing.assert_close(total, per_token.sum(1))
    total.sum().backward()
    grads = [p.grad for p in tiny_lm.parameters() if p.grad is not None]
    assert grads and any(g.abs().sum() > 0 for g in grads)
    tiny_lm.zero_grad(set_to_none=True)


def test_token_logprobs_rejects_bad_inputs(tiny_lm):
    ids, attn, comp = pad_sequences([[3]], [[4]], pad_id=0)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        token_logprobs(tiny_lm, ids, attn, comp, temperature=0.0)
    with pytest.raises(ValueError, match="masks must match"):
        token_logprobs(tiny_lm, ids, attn[:, :1], comp)


def _logprobs_and_grads(model, inputs, weights):
    """token_logprobs with entropies, and the gradient of sum(weights * logprobs) for every parameter."""
    logprobs, entropy = token_logprobs(model, *inputs, temperature=0.7, with_entropy=True)
    model.zero_grad(set_to_none=True)
    (logprobs * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), entropy, grads


@pytest.mark.parametrize("arch", ["qwen3", "gemma2"])
def test_tiled_lm_head_equals_full_logits(arch, monkeypatch):
    """The decoder + tiled lm_head path gives the logprobs, entropies and parameter gradients (the tied
    embedding included) of log_softmax over the model's own full logits; Gemma 2's final soft-cap at 0.5
    bends every logit, so a missing cap would show."""
    from tests.conftest import tiny_model

    model = tiny_model(arch, vocab_size=64)
    if arch == "gemma2":
        model.config.final_logit_softcapping = 0.5
    for p in model.parameters():
        p.requires_grad_(True)
    assert lm_head_of(model) is not None
    inputs = pad_sequences([[3, 17, 4], [8]], [[9, 22, 41], [5, 6, 7, 8, 9]], pad_id=0)
    weights = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(0))
    tiled = _logprobs_and_grads(model, inputs, weights)
    monkeypatch.setattr(grpo, "lm_head_of", lambda model: None)  # the full (B, T, V) logits
    full = _logprobs_and_grads(model, inputs, weights)
    torch.testing.assert_close(tiled[0], full[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(tiled[1], full[1], rtol=0, atol=1e-5)
    assert tiled[2].keys() == full[2].keys()
    for name in full[2]:
        torch.testing.assert_close(tiled[2][name], full[2][name], rtol=1e-4, atol=1e-5, msg=name)
    assert (tiled[1][inputs[2]] > 0).all() and (tiled[1][~inputs[2]] == 0).all()


def test_lm_head_with_bias_is_not_tiled(tiny_lm):
    import copy

    model = copy.deepcopy(tiny_lm)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(50))
    assert lm_head_of(model) is None and lm_head_of(tiny_lm) is not None


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


def test_left_padding_also_keeps_real_token_logprobs(tiny_lm):
    # pad_sequences right-pads, but position ids from the mask make left padding safe too.
    ids, attn, comp = pad_sequences([[3, 17]], [[9, 22, 5]], pad_id=0)
    left_ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    left_attn = torch.cat([torch.zeros(1, 3, dtype=torch.long), attn], dim=1)
    left_comp = torch.cat([torch.zeros(1, 3, dtype=torch.bool), comp], dim=1)
    with torch.no_grad():
        alone = token_logprobs(tiny_lm, ids, attn, comp)
        padded = token_logprobs(tiny_lm, left_ids, left_attn, left_comp)
    torch.testing.assert_close(padded[:, 3:], alone, atol=1e-5, rtol=1e-5)


def test_docstring_examples():
    import doctest

    import bebop.rl.grpo

    assert doctest.testmod(bebop.rl.grpo).failed == 0
