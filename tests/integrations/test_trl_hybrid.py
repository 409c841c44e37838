"""TRL's GRPOTrainer with Bebop's engine rollouts on hybrid models (Gated DeltaNet and Mamba2 layers), through
the public ``bebop_rollout_func``: greedy rollouts are TRL's own greedy completions, and a GRPO step trains."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("trl")

from bebop.integrations.trl import bebop_rollout_func  # noqa: E402
from bebop.mtp.head import MtpHead  # noqa: E402
from tests.helpers.models import tiny_model  # noqa: E402
from tests.integrations.test_trl import EOS_ID, PROMPTS, VOCAB, make_trainer, trl_completions  # noqa: E402


def _hybrid(arch: str):
    """A trainable tiny hybrid whose next-token distributions are far from uniform (scaled lm_head)."""
    model = tiny_model(arch, vocab_size=VOCAB, eos_token_id=EOS_ID)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    for p in model.parameters():
        p.requires_grad_(True)
    return model.train()


@pytest.mark.parametrize("arch", ["qwen3_5_hybrid", "nemotron_h"])
def test_greedy_engine_rollouts_match_trl_generation_and_train(tmp_path, arch):
    model = _hybrid(arch)
    head = MtpHead(model)
    greedy = dict(generation_kwargs={"do_sample": False})
    prompts = [p for p in PROMPTS for _ in range(2)]
    trainer = make_trainer(tmp_path, model, bebop_rollout_func(head, mode="rs", speculate_k=3, backend="engine"),
                           **greedy)
    assert trl_completions(trainer, prompts) == trl_completions(make_trainer(tmp_path, model, **greedy), prompts)
    trainer = make_trainer(tmp_path, model, bebop_rollout_func(head, mode="rs", speculate_k=3, backend="engine"))
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    trainer.train()  # sampled at T = 1: a group's completions differ, so the policy moves
    assert any(not torch.equal(before[name], p) for name, p in model.named_parameters())
    assert trainer.state.log_history[0]["spec/accept_length"] >= 1.0
