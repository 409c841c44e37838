"""A tiny RL policy (the embedded model's shape, random weights), a short RL config and a dense test reward."""

from __future__ import annotations

import json

import torch

from bebop.embedded import PretrainConfig, build_model, build_tokenizer
from bebop.rl import RLConfig, resolve_rl_config
from bebop.rollout.logprobs import token_logprobs

TINY = PretrainConfig(hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)
REWARD = "tests.helpers.rl:char_length_reward"
TIMING_KEYS = ("rollout_s", "rollout_wait_s", "train_s", "mtp_s", "sync_s", "step_s", "tokens_per_s")


def char_length_reward(prompts: list[str], completions: list[str], **_: list) -> list[float]:
    """Dense test reward in [0, 1]: longer decoded completions score higher."""
    return [min(len(c), 100) / 100 for c in completions]


def tiny_policy(seed: int = 0):
    """(model, tokenizer): a random 2-layer Qwen3 with tied embeddings, like the embedded model."""
    tok = build_tokenizer()
    torch.manual_seed(seed)
    model = build_model(TINY, len(tok), tok.pad_token_id, tok.eos_token_id).eval()
    return model, tok


def tiny_config(**overrides) -> RLConfig:
    values = dict(steps=2, prompts_per_step=2, group_size=2, max_new_tokens=8, lr=1e-3, save_every=0,
                  reward=REWARD, seed=3)
    return resolve_rl_config(None, {**values, **overrides})


def read_rows(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def sequence_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, completion_mask: torch.Tensor,
                      temperature: float = 1.0) -> torch.Tensor:  # (B,)
    """Total log-probability of each row's completion: the sum of ``token_logprobs`` over T (float32)."""
    return token_logprobs(model, input_ids, attention_mask, completion_mask, temperature).sum(dim=1)
