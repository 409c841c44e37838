"""GRPO with speculative rollouts (arXiv 2606.12370 §1.4, §5).

    cfg = resolve_rl_config("rl.toml", {"mode": "rs", "steps": 50})
    rows = train_rl(model, tokenizer, head, cfg, "runs/rs")  # config.json, metrics.jsonl, token_stats.jsonl

Modules:
    config.py      RLConfig (+ SamplingParams, SpecConfig, PolicyConfig, MtpUpdateConfig) and resolve_rl_config:
                   one flat table
    loop.py        rl_step (rollout -> reward -> advantages -> loss -> update -> log) and train_rl
    prompts.py     the prompts of each step (embedded problems or data rows) and the task's reward
    grpo.py        pure tensor pieces: group_advantages, policy_loss, kl_k3, micro_batches
    update.py      the policy's update in micro-batches: fixed_logprobs, update_policy
    online.py      the optional online MTP head update (its own AdamW; no gradient to the policy)
    checkpoint.py  atomic checkpoints (weights, optimizers, RNG, step, config) and exact resume
    rewards.py     reward functions (math_reward, load_reward for module:function specs)
    data.py        prompt files (JSONL/parquet) for task math
"""

from bebop.rl.config import MtpUpdateConfig, PolicyConfig, RLConfig, config_fields, flat_config, resolve_rl_config


def __getattr__(name: str):
    """``rl_step`` and ``train_rl`` load torch: imported on first use, so ``bebop --help`` stays fast."""
    if name in ("rl_step", "train_rl"):
        from bebop.rl import loop

        return getattr(loop, name)
    raise AttributeError(f"module 'bebop.rl' has no attribute {name!r}")


__all__ = [
    "MtpUpdateConfig",
    "PolicyConfig",
    "RLConfig",
    "config_fields",
    "flat_config",
    "resolve_rl_config",
    "rl_step",
    "train_rl",
]
