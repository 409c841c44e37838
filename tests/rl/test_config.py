"""``bebop.rl.config``: a run's flat ``config.json`` resolves back to the same config, older runs' included."""

from __future__ import annotations

from bebop.rl.config import RLConfig, flat_config, max_speculate_k, resolve_rl_config

# NOTE: config.json of a run made before SamplingParams and SpecConfig were embedded as groups (the defaults)
OLD_CONFIG_JSON = {
    "mode": "rs", "speculate_k": 3, "verify": "token", "auto_every": 10, "mtp_loss": "e2e_tv", "task": "embedded",
    "data": "", "reward": "", "steps": 100, "prompts_per_step": 8, "group_size": 8, "max_new_tokens": 48,
    "temperature": 1.0, "top_k": 0, "top_p": 1.0, "async_rollout": False, "backend": "engine", "save_every": 25,
    "seed": 0, "label": "", "lr": 5e-05, "weight_decay": 0.0, "clip_eps": 0.2, "kl_coef": 0.0, "update_epochs": 1,
    "mean_only": False, "grad_clip": 1.0, "micro_batch_tokens": 16384, "mtp_update": "frozen",
    "online_loss": "e2e_tv", "mtp_lr": 0.0001, "mtp_grad_clip": 1.0, "mtp_speculate_k": 3,
}


def test_an_older_run_s_config_json_resolves_to_the_same_run():
    cfg = resolve_rl_config(None, OLD_CONFIG_JSON)
    assert cfg == RLConfig() and flat_config(cfg) == OLD_CONFIG_JSON
    changed = resolve_rl_config(None, {**OLD_CONFIG_JSON, "temperature": 0.7, "mode": "to", "speculate_k": 2})
    assert (changed.sampling.temperature, changed.spec.mode, changed.spec.speculate_k) == (0.7, "to", 2)


def test_the_deepest_k_a_run_drafts():
    assert [max_speculate_k(resolve_rl_config(None, {"mode": m, "speculate_k": k}))
            for m, k in (("none", 3), ("rs", 2), ("to", "auto"))] == [0, 2, 4]
