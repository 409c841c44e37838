"""bebop.rl.update: micro-batches change memory only; the logprobs, gradients and metrics are the one-batch ones."""

from __future__ import annotations

import pytest
import torch

from bebop.rl.config import PolicyConfig
from bebop.rollout.logprobs import pad_sequences
from bebop.rl.update import fixed_logprobs, update_policy
from tests.helpers.rl import tiny_policy


def _batch(seed: int = 0):
    """Six ragged rows (prompts of 2-5 tokens, completions of 1-9), right-padded, and their advantages."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in torch.randint(2, 6, (6,), generator=g)]
    completions = [torch.randint(3, 200, (int(n),), generator=g).tolist() for n in torch.randint(1, 10, (6,), generator=g)]
    return pad_sequences(prompts, completions, pad_id=0), torch.randn(6, generator=g)


def _update(max_tokens: int):
    """One update of a tiny policy (SGD at rate 0.5, so the weights show the gradient) against a reference."""
    model, _ = tiny_policy()
    reference, _ = tiny_policy(seed=1)
    for p in model.parameters():
        p.requires_grad_(True)
    inputs, advantages = _batch()
    old, ref = fixed_logprobs(model, reference, inputs, 0.8, max_tokens)
    with torch.no_grad():  # an older policy than the one updated, so the ratio and its clip matter
        for p in model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    cfg = PolicyConfig(kl_coef=0.1, update_epochs=2, micro_batch_tokens=max_tokens)
    metrics = update_policy(model, torch.optim.SGD(model.parameters(), lr=0.5), inputs, old, ref, advantages, cfg, 0.8)
    return old, ref, metrics, model.state_dict()


def test_micro_batches_give_the_one_batch_update():
    """Budgets of 1 (one row each), 24 (a few rows) and 10,000 padded tokens (all rows): the same old and
    reference logprobs, metrics and weights after two epochs, to float32 rounding."""
    whole = _update(10_000)
    for max_tokens in (1, 24):
        parts = _update(max_tokens)
        torch.testing.assert_close(parts[0], whole[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(parts[1], whole[1], rtol=0, atol=1e-6)
        assert parts[2].keys() == whole[2].keys()
        for key, value in whole[2].items():
            assert parts[2][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
        for key, value in whole[3].items():
            torch.testing.assert_close(parts[3][key], value, rtol=1e-5, atol=1e-6, msg=key)
    assert whole[2]["rl/kl"] > 0 and whole[2]["rl/clip_fraction"] > 0  # both terms of the loss are live
