"""TRL's GRPOTrainer rolling out through Bebop's vLLM backend (``make test-vllm``): two GRPO steps of rs
drafts on the embedded model, then greedy completions of the trained policy against Bebop's engine.

The embedded model and its e2e-TV head come from the user's Bebop cache (BEBOP_CACHE_DIR).
"""

from __future__ import annotations

import copy
import os

import pytest

vllm = pytest.importorskip("vllm")
pytest.importorskip("trl")
pytestmark = pytest.mark.vllm

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from bebop import embedded, models  # noqa: E402
from bebop.integrations.trl import bebop_rollout_func  # noqa: E402
from bebop.speculative import SamplingParams, generate  # noqa: E402
from bebop.task import arith  # noqa: E402

K = 3
MAX_TOKENS = 32
GROUP = 4  # num_generations


def test_grpo_steps_through_vllm_then_greedy_equals_engine(tmp_path):
    """Two GRPO steps (rs, K = 3, T = 1) sampled by vLLM log an accept length in [1, K + 1] each step and null
    for what vLLM cannot measure; then, with the trained weights synced into vLLM, greedy rollouts through the
    vLLM backend are the engine backend's token for token, and differ from the untrained policy's."""
    model, tok = models.load_model(device="cpu", dtype=embedded.CACHE_DTYPE)
    head_dir = embedded.ensure_embedded_head("e2e_tv", model, tok)
    for p in model.parameters():  # load_model freezes the model; GRPO trains all of it
        p.requires_grad_(True)
    untrained = copy.deepcopy(model).eval()
    problems = arith.make_problems(8, seed=11)
    data = Dataset.from_dict({"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]})
    config = GRPOConfig(output_dir=str(tmp_path / "out"), max_steps=2, seed=0, learning_rate=1e-3,
                        per_device_train_batch_size=4 * GROUP, num_generations=GROUP,
                        max_completion_length=MAX_TOKENS, temperature=1.0, beta=0.0, logging_steps=1,
                        save_strategy="no", report_to=[], use_cpu=True, bf16=False)
    rollout = bebop_rollout_func(head_dir, mode="rs", speculate_k=K, backend="vllm")
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=arith.arith_reward, args=config,
                          train_dataset=data, rollout_func=rollout)
    try:
        trainer.train()
        rows = [r for r in trainer.state.log_history if "loss" in r]
        assert len(rows) == 2
        for r in rows:
            assert 1.0 < r["spec/accept_length"] <= K + 1 and r["spec/num_drafts"] > 0
            assert r["spec/target_entropy"] is None and r["spec/accepted_per_pos/1"] is None
            assert r["spec/rollout_seconds"] > 0 and r["spec/num_generated_tokens"] > r["spec/num_drafts"]
        assert (tmp_path / "out" / "bebop_rollout.json").exists()
        assert not (tmp_path / "out" / "token_stats.jsonl").exists()

        trainer.generation_config.do_sample = False  # greedy, read by both rollouts from the trainer
        prompts = [p.prompt for p in arith.make_problems(12, seed=3)]
        out = rollout(prompts, trainer)  # pushes the trained weights into vLLM first
        theirs = out["completion_ids"]
        engine = bebop_rollout_func(head_dir, mode="rs", speculate_k=K, token_stats=False)
        ours = engine(prompts, trainer)["completion_ids"]
        assert theirs == ours
        before = generate(untrained, tok, out["prompt_ids"], sampling=SamplingParams(0.0, max_new_tokens=MAX_TOKENS))
        assert [list(t) for t in before.token_ids] != theirs  # training changed greedy output: the sync mattered
    finally:
        rollout.close()
