"""bebop.rl.online: the head learns from rollouts, and its update never touches the policy."""

from __future__ import annotations

import pytest
import torch

from bebop.mtp.head import MtpHead
from bebop.rl.config import MtpUpdateConfig
from bebop.rl.loop import train_rl
from bebop.rl.online import make_head_optimizer, online_head_step, rollout_sequences
from tests.helpers.rl import tiny_config, tiny_policy


def _sequences(num: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 218, (5,), generator=g).tolist() for _ in range(num)]
    completions = [torch.randint(3, 218, (int(n),), generator=g).tolist() for n in torch.randint(4, 9, (num,), generator=g)]
    return rollout_sequences(prompts, completions)


def test_rollout_sequences_start_at_the_completion():
    seqs = rollout_sequences([[5, 6], [7]], [[8, 9], []])
    assert seqs.token_ids == [[5, 6, 8, 9], [7]] and seqs.starts == [2, 1]


@pytest.mark.parametrize("loss", ["ce", "tv", "e2e_tv"])
def test_online_step_moves_the_head_only(loss):
    model, tok = tiny_policy()
    for p in model.parameters():
        p.requires_grad_(True)  # as during RL: the policy is trainable, so a leak would show
    head = MtpHead(model)
    policy_before = {k: v.clone() for k, v in model.state_dict().items()}
    head_before = {k: v.clone() for k, v in head.state_dict().items()}
    cfg = MtpUpdateConfig(mtp_update="online", online_loss=loss, mtp_lr=1e-2, mtp_speculate_k=2)
    metrics = online_head_step(model, head, make_head_optimizer(head, cfg), _sequences(), cfg, 1.0, tok.pad_token_id)
    assert torch.isfinite(torch.tensor(metrics["mtp/loss"])) and metrics["mtp/num_chains"] > 0
    assert len(metrics["mtp/alpha_rs"]) == 2
    assert all(p.grad is None for p in model.parameters()), "a gradient reached the policy"
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in policy_before.items()), "the policy changed"
    moved = [not torch.equal(v, head.state_dict()[k]) for k, v in head_before.items()]
    assert all(moved), "every head parameter should move"


def test_online_step_skips_batches_without_chains():
    model, tok = tiny_policy()
    head = MtpHead(model)
    cfg = MtpUpdateConfig(mtp_update="online")
    short = rollout_sequences([[5, 6]], [[7]])  # one completion token: no verified draft step
    metrics = online_head_step(model, head, make_head_optimizer(head, cfg), short, cfg, 1.0, tok.pad_token_id)
    assert metrics["mtp/num_chains"] == 0 and metrics["mtp/loss"] is None


def test_online_run_trains_head_and_policy(tmp_path):
    model, tok = tiny_policy()
    head = MtpHead(model)
    policy_before = {name: p.detach().clone() for name, p in model.named_parameters()}
    head_before = {k: v.clone() for k, v in head.state_dict().items()}
    cfg = tiny_config(mode="rs", mtp_update="online", online_loss="tv", mtp_lr=1e-2)
    rows = train_rl(model, tok, head, cfg, tmp_path, show_progress=False)
    assert all(torch.isfinite(torch.tensor(r["mtp/loss"])) for r in rows)
    assert all(not torch.equal(v, head.state_dict()[k]) for k, v in head_before.items()), "head did not learn"
    assert all(not torch.equal(p, policy_before[n]) for n, p in model.named_parameters()), "policy did not learn"
    assert all(r["mtp_s"] > 0 for r in rows)


@pytest.mark.parametrize("loss", ["ce", "e2e_tv"])
def test_micro_batches_give_the_one_batch_step(loss):
    """One row per micro-batch (max_tokens 13 < two rows) and the whole batch at once: the same gradient
    (an SGD step of rate 1 shows it in the weights; AdamW's first step, g / |g|, would amplify the rounding
    of near-zero entries), the same loss, alpha and chain count. e2e_tv averages over chains, ce over
    (chain, step) entries, so both weightings are covered."""
    cfg = MtpUpdateConfig(mtp_update="online", online_loss=loss, mtp_lr=1e-2, mtp_speculate_k=2)
    results = []
    for max_tokens in (10_000, 13):
        model, tok = tiny_policy()
        head = MtpHead(model)
        metrics = online_head_step(model, head, torch.optim.SGD(head.parameters(), lr=1.0), _sequences(), cfg, 1.0,
                                   tok.pad_token_id, max_tokens)
        results.append((metrics, head.state_dict()))
    (whole, whole_head), (parts, parts_head) = results
    assert parts["mtp/num_chains"] == whole["mtp/num_chains"] > 0
    assert parts["mtp/loss"] == pytest.approx(whole["mtp/loss"], abs=1e-6)
    assert parts["mtp/grad_norm"] == pytest.approx(whole["mtp/grad_norm"], rel=1e-5)
    assert parts["mtp/alpha_rs"] == pytest.approx(whole["mtp/alpha_rs"], abs=1e-6)
    for key, value in whole_head.items():
        torch.testing.assert_close(parts_head[key], value, rtol=1e-5, atol=1e-6, msg=key)
