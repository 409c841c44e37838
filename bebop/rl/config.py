"""``RLConfig``: everything ``bebop rl`` needs, resolved from one flat table.

The settings are grouped by concern into three small frozen dataclasses: ``RLConfig`` (the run,
the rollout and the task), ``PolicyConfig`` (how the policy learns) and ``MtpUpdateConfig``
(what happens to the MTP head). Files and flags stay *flat*: every leaf field has a unique name
(``lr``, ``mtp_lr``, ...) and ``resolve_rl_config`` routes each key to its dataclass, so
``--mtp-lr 1e-4`` and ``mtp_lr = 1e-4`` in a TOML file mean the same thing, and ``config.json``
of a run (``flat_config``) is one flat object that ``bebop.analysis.report`` reads.

Precedence: dataclass defaults < config file < overrides (None values skipped); unknown keys
are an error that lists the valid ones.

Example:
    >>> cfg = resolve_rl_config(None, {"mode": "rs", "lr": 1e-5, "mtp_update": "online"})
    >>> cfg.mode, cfg.policy.lr, cfg.mtp.mtp_update
    ('rs', 1e-05, 'online')
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from bebop.config import (
    AUTO,
    AUTO_EVERY,
    AUTO_MAX_K,
    DEFAULT_DRAFT_LOSS,
    DRAFT_LOSS_NAMES,
    VERIFY_CHOICES,
    Flag,
    flags_of,
    merge_sources,
    option,
    resolve,
    speculate_k_problem,
    speculate_k_value,
)
from bebop.utils.io import BebopError

# NOTE: nothing here imports torch (the CLI builds its --help from this module); the checks import
# the loss and mode tables lazily.
TASKS = ("embedded", "math")  # prompt sources: the built-in arithmetic task, or a JSONL/parquet file
MTP_UPDATES = ("frozen", "online")  # what happens to the head during RL (paper §5)
RESUME_MAY_CHANGE = ("steps", "save_every", "label", "backend", "micro_batch_tokens")  # keys a resumed run may set differently
# NOTE: verl's default token budget per micro-batch. The activations a backward keeps grow linearly with it
# (docs/scaling.md measures them per token); a row longer than the budget goes through alone.
MICRO_BATCH_TOKENS = 16_384


@dataclass(frozen=True)
class PolicyConfig:
    """How the policy learns from a rollout batch (GRPO, AdamW)."""

    lr: float = option(5e-5, "policy AdamW learning rate (tiny embedded model; the paper uses 1e-6..2e-6 at 35B)")
    weight_decay: float = option(0.0, "policy AdamW weight decay")
    clip_eps: float = option(0.2, "epsilon of the PPO/GRPO ratio clip")
    kl_coef: float = option(0.0, "beta of the k3 KL penalty to the initial policy; 0 = no reference model")
    update_epochs: int = option(1, "mu, optimizer steps on each rollout batch (full batch each)")
    mean_only: bool = option(False, "advantages without dividing by the group std (Dr. GRPO)")
    grad_clip: float = option(1.0, "max global gradient norm of the policy; 0 = no clipping")
    micro_batch_tokens: int = option(MICRO_BATCH_TOKENS,
                                     "padded tokens (rows x longest row) per forward/backward of the update and the "
                                     "online head step; gradients add up over micro-batches, so only memory changes")


@dataclass(frozen=True)
class MtpUpdateConfig:
    """What happens to the MTP draft head during RL."""

    mtp_update: str = option("frozen",
                             "frozen: weights never change (paper recipe) | online: trained on each rollout")
    online_loss: str = option(DEFAULT_DRAFT_LOSS, f"draft loss of the online update: {' | '.join(DRAFT_LOSS_NAMES)}")
    mtp_lr: float = option(1e-4, "head AdamW learning rate (online only)")
    mtp_grad_clip: float = option(1.0, "max gradient norm of the head, separate from the policy's (paper §5.3)")
    mtp_speculate_k: int = option(3, "draft steps unrolled by the online loss")


@dataclass(frozen=True)
class RLConfig:
    """One GRPO run with speculative rollouts; defaults fit the embedded model on a CPU."""

    mode: str = option("rs", "rollout decoding: none (plain) | to (target-only) | rs (rejection sampling) | auto")
    speculate_k: int | str = option(3, "K, drafts verified per target forward in the rollout; or auto (1-4)")
    verify: str = option("token", "how mode rs verifies a drafted chain: token (token-wise) | block (jointly, "
                         "Sun et al. 2024; exact, never fewer accepted drafts in expectation)", choices=VERIFY_CHOICES)
    auto_every: int = option(AUTO_EVERY,
                             "with mode or speculate_k auto: probe every this many steps (choose in between; "
                             "a setting chosen for the first time is confirmed by a probe in the next step)")
    mtp_loss: str = option(DEFAULT_DRAFT_LOSS, "loss the head was trained with (picks the embedded head; logged)")
    task: str = option("embedded",
                       "prompt source: embedded (built-in arithmetic) | math (--data file; implied by data)")
    data: str = option("", 'JSONL/parquet prompt file with a "prompt" field (task math)')
    reward: str = option("", 'reward spec: name, module:function or file.py:function; "" = the task\'s own')
    steps: int = option(100, "RL steps (one rollout batch and its updates each)")
    prompts_per_step: int = option(8, "B, distinct prompts per step")
    group_size: int = option(8, "G, completions sampled per prompt (>= 2: advantages are within a group)")
    max_new_tokens: int = option(48, "completion length limit, EOS included")
    temperature: float = option(1.0, "sampling temperature of the rollout and of the loss's logprobs (> 0)")
    top_k: int = option(0, "top-k filter of the rollout; 0 = off")
    top_p: float = option(1.0, "nucleus filter of the rollout; 1 = off")
    async_rollout: bool = option(False, "sample step s+1 in a thread while step s updates (one step off-policy)",
                                 aliases=("--async",))
    backend: str = option("engine",
                          "rollout engine: engine (Bebop's: exact, seeded, per-token stats) | vllm (the vllm extra)")
    save_every: int = option(25, "checkpoint every this many steps (and at the end); 0 = only at the end")
    seed: int = option(0, "seeds prompts, rollout sampling (with step and row) and initial RNG states")
    label: str = option("", 'run name in reports; "" = built from mode, mtp_loss and mtp_update')
    policy: PolicyConfig = option(PolicyConfig(), "learning-rate, clip, KL and epoch settings")
    mtp: MtpUpdateConfig = option(MtpUpdateConfig(), "MTP head update settings")


_GROUPS = {"policy": PolicyConfig, "mtp": MtpUpdateConfig}  # nested RLConfig fields and their classes


def _leaf_owners() -> dict[str, type]:
    """Flat key -> the dataclass that holds it, in declaration order."""
    owners: dict[str, type] = {}
    for f in dataclasses.fields(RLConfig):
        for name in [g.name for g in dataclasses.fields(_GROUPS[f.name])] if f.name in _GROUPS else [f.name]:
            if name in owners:
                raise AssertionError(f"config key {name!r} is defined twice")
            owners[name] = _GROUPS.get(f.name, RLConfig)
    return owners


def flat_config(cfg: RLConfig) -> dict[str, Any]:
    """The config as one flat dict (what ``config.json`` holds and ``resolve_rl_config`` reads).

    Example:
        >>> flat_config(RLConfig())["mtp_update"]
        'frozen'
    """
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        out.update(dataclasses.asdict(value) if f.name in _GROUPS else {f.name: value})
    return out


def config_fields() -> dict[str, Flag]:
    """Every flat key as a flag: its type, default and help text (``option``; the CLI's --help).

    Example:
        >>> config_fields()["mtp_lr"][:2]
        (<class 'float'>, 0.0001)
    """
    flags = {name: flag for cls in (RLConfig, *_GROUPS.values())
             for name, flag in flags_of(cls, skip=tuple(_GROUPS)).items()}
    flags["speculate_k"] = flags["speculate_k"]._replace(type=speculate_k_value)  # NOTE: an integer or auto
    return {name: flags[name] for name in _leaf_owners()}


def max_speculate_k(cfg: RLConfig) -> int:
    """The deepest K a rollout of the run may draft: 0 in mode none, AUTO_MAX_K for speculate_k auto."""
    if cfg.mode == "none":
        return 0
    return AUTO_MAX_K if cfg.speculate_k == AUTO else cfg.speculate_k


def check_rl_config(cfg: RLConfig) -> None:
    """Raises BebopError (one line) on a value no run could use."""
    from bebop.losses import DRAFT_LOSSES
    from bebop.rollout.base import backend_problem
    from bebop.speculative.settings import SamplingParams, SpecConfig, settings_problems, verify_problem

    problems = [backend_problem(cfg.backend, cfg.mode, cfg.speculate_k)]
    sampling = SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p, cfg.max_new_tokens)
    problems += settings_problems(SpecConfig(cfg.mode, cfg.speculate_k), sampling, greedy_ok=False)
    if problem := verify_problem(cfg.mode, cfg.verify, cfg.backend):
        problems.append(problem)
    if cfg.task not in TASKS:
        problems.append(f"task {cfg.task!r} is not one of {', '.join(TASKS)}")
    if cfg.task == "math" and not cfg.data:
        problems.append("task math needs data (a JSONL/parquet prompt file)")
    if cfg.task == "embedded" and cfg.data:
        problems.append(f"task embedded uses its own prompts, so data {cfg.data!r} would be ignored; "
                        "use task math (implied by data when task is not set) or drop data")
    if cfg.mtp.mtp_update not in MTP_UPDATES:
        problems.append(f"mtp_update {cfg.mtp.mtp_update!r} is not one of {', '.join(MTP_UPDATES)}")
    if cfg.mtp.online_loss not in DRAFT_LOSSES:
        problems.append(f"online_loss {cfg.mtp.online_loss!r} is not one of {', '.join(DRAFT_LOSSES)}")
    if cfg.group_size < 2:
        problems.append(f"group_size must be >= 2 (advantages compare a prompt's samples), got {cfg.group_size}")
    for name in ("steps", "prompts_per_step", "auto_every"):
        if getattr(cfg, name) < 1:
            problems.append(f"{name} must be >= 1, got {getattr(cfg, name)}")
    if cfg.policy.update_epochs < 1:
        problems.append(f"update_epochs must be >= 1, got {cfg.policy.update_epochs}")
    if cfg.policy.micro_batch_tokens < 1:
        problems.append(f"micro_batch_tokens must be >= 1, got {cfg.policy.micro_batch_tokens}")
    if problem := speculate_k_problem(cfg.mtp.mtp_speculate_k, auto_ok=False):
        problems.append("mtp_" + problem)
    if cfg.save_every < 0 or cfg.policy.kl_coef < 0:
        problems.append("save_every and kl_coef must be >= 0")
    problems = [p for p in problems if p]
    if problems:
        raise BebopError("invalid rl config: " + "; ".join(problems))


def rollout_settings(cfg: RLConfig):
    """What the run's rollouts read, typed: a ``bebop.rollout.runner.RolloutSettings``."""
    from bebop.rollout.runner import RolloutSettings
    from bebop.speculative.settings import SamplingParams, SpecConfig

    return RolloutSettings(
        sampling=SamplingParams(cfg.temperature, cfg.top_k, cfg.top_p, cfg.max_new_tokens),
        spec=SpecConfig(cfg.mode, cfg.speculate_k, verify=cfg.verify), group_size=cfg.group_size, seed=cfg.seed,
        async_rollout=cfg.async_rollout, online_head=cfg.mtp.mtp_update == "online", auto_every=cfg.auto_every)


def resolve_rl_config(file: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> RLConfig:
    """Builds an ``RLConfig`` from defaults, then a flat TOML/YAML ``file``, then ``overrides``.

    Args:
        file: a config file holding a flat table of keys of ``config_fields()``, or None.
        overrides: flat keys from the command line; None values are skipped (flag not given).

    Returns:
        The resolved, checked config.

    Raises:
        BebopError: unknown key (the message lists the valid ones), wrong type, or an invalid value.
    """
    owners = _leaf_owners()
    values = merge_sources(file, overrides, list(owners))
    if values.get("data") and "task" not in values:
        values["task"] = "math"  # a data file implies the file task
    groups = {
        name: resolve(cls, None, {k: v for k, v in values.items() if owners[k] is cls}) for name, cls in _GROUPS.items()
    }
    top = {k: v for k, v in values.items() if owners[k] is RLConfig}
    auto_k = top.get("speculate_k") == AUTO  # NOTE: the one non-int value of an int key
    cfg = resolve(RLConfig, None, {**top, **groups, **({"speculate_k": None} if auto_k else {})})
    if auto_k:
        cfg = dataclasses.replace(cfg, speculate_k=AUTO)
    check_rl_config(cfg)
    return cfg
