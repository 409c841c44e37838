"""``RLConfig``: everything ``bebop rl`` needs, resolved from one flat table.

The settings are grouped by concern into small frozen dataclasses: ``RLConfig`` (the run and the
task) embeds the rollout's ``SamplingParams`` and ``SpecConfig`` (``bebop.speculative.settings``,
where each is declared), ``PolicyConfig`` (how the policy learns) and ``MtpUpdateConfig`` (what
happens to the MTP head), each a ``bebop.config.group``. Files and flags stay *flat*: every leaf
field has a unique name (``lr``, ``mtp_lr``, ``temperature``, ...) and ``bebop.config.resolve``
routes each key to its group, so ``--mtp-lr 1e-4`` and ``mtp_lr = 1e-4`` in a TOML file mean the
same thing, and ``config.json`` of a run (``flat_config``) is one flat object that
``bebop.analysis.report`` reads and a resume resolves again.

Precedence: dataclass defaults < config file < overrides (None values skipped); unknown keys
are an error that lists the valid ones.

Example:
    >>> cfg = resolve_rl_config(None, {"mode": "rs", "lr": 1e-5, "mtp_update": "online"})
    >>> cfg.spec.mode, cfg.policy.lr, cfg.mtp.mtp_update
    ('rs', 1e-05, 'online')
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from bebop.config import (
    AUTO_EVERY,
    BACKEND,
    DEFAULT_DRAFT_LOSS,
    DRAFT_LOSS_NAMES,
    SEED,
    Flag,
    drafted_k,
    field_problems,
    fixed_speculate_k,
    flags_of,
    flat_keys,
    flatten,
    group,
    integer_in,
    merge_sources,
    number_in,
    option,
    positive_temperature,
    resolve,
)
from bebop.speculative.settings import ROLLOUT_SPEC, SamplingParams, SpecConfig, verify_problem
from bebop.utils.errors import BebopError

# NOTE: nothing here imports torch (the CLI builds its --help from this module); check_rl_config imports
# the backend rule (bebop.rollout.base) lazily.
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
    kl_coef: float = option(0.0, "beta of the k3 KL penalty to the initial policy; 0 = no reference model",
                            check=number_in(0, float("inf")))
    update_epochs: int = option(1, "mu, optimizer steps on each rollout batch (full batch each)", check=integer_in(1))
    mean_only: bool = option(False, "advantages without dividing by the group std (Dr. GRPO)")
    grad_clip: float = option(1.0, "max global gradient norm of the policy; 0 = no clipping")
    micro_batch_tokens: int = option(MICRO_BATCH_TOKENS,
                                     "padded tokens (rows x longest row) per forward/backward of the update and the "
                                     "online head step; gradients add up over micro-batches, so only memory changes",
                                     check=integer_in(1))


@dataclass(frozen=True)
class MtpUpdateConfig:
    """What happens to the MTP draft head during RL."""

    mtp_update: str = option("frozen",
                             "frozen: weights never change (paper recipe) | online: trained on each rollout",
                             choices=MTP_UPDATES)
    online_loss: str = option(DEFAULT_DRAFT_LOSS, "draft loss of the online update", choices=DRAFT_LOSS_NAMES)
    mtp_lr: float = option(1e-4, "head AdamW learning rate (online only)")
    mtp_grad_clip: float = option(1.0, "max gradient norm of the head, separate from the policy's (paper §5.3)")
    mtp_speculate_k: int = option(3, "draft steps unrolled by the online loss", check=fixed_speculate_k)


@dataclass(frozen=True)
class RLConfig:
    """One GRPO run with speculative rollouts; defaults fit the embedded model on a CPU."""

    sampling: SamplingParams = group(SamplingParams(max_new_tokens=48), skip=("stop",))  # T > 0 (check_rl_config)
    spec: SpecConfig = group(ROLLOUT_SPEC, skip=("draft_temperature", "filter_drafts", "num_drafts",
                                                 "recurrent_rollback"))  # mode, K, verify
    auto_every: int = option(AUTO_EVERY,
                             "with mode or speculate_k auto: probe every this many steps (choose in between; "
                             "a setting chosen for the first time is confirmed by a probe in the next step)",
                             check=integer_in(1))
    mtp_loss: str = option(DEFAULT_DRAFT_LOSS, "loss the head was trained with (picks the embedded head; logged)")
    task: str = option("embedded",
                       "prompt source: embedded (built-in arithmetic) | math (--data file; implied by data)",
                       choices=TASKS)
    data: str = option("", 'JSONL/parquet prompt file with a "prompt" field (task math)', role="input")
    reward: str = option("", 'reward spec: name, module:function or file.py:function; "" = the task\'s own')
    steps: int = option(100, "RL steps (one rollout batch and its updates each)", check=integer_in(1))
    prompts_per_step: int = option(8, "B, distinct prompts per step", check=integer_in(1))
    group_size: int = option(8, "G, completions sampled per prompt (>= 2: advantages are within a group)",
                             check=integer_in(2, note=" (advantages compare a prompt's samples)"))
    async_rollout: bool = option(False, "sample step s+1 in a thread while step s updates (one step off-policy)",
                                 aliases=("--async",))
    backend: str = BACKEND.field()
    save_every: int = option(25, "checkpoint every this many steps (and at the end); 0 = only at the end",
                             check=integer_in(0))
    seed: int = SEED.field()
    label: str = option("", 'run name in reports; "" = built from mode, mtp_loss and mtp_update')
    policy: PolicyConfig = group(PolicyConfig())  # learning-rate, clip, KL and epoch settings
    mtp: MtpUpdateConfig = group(MtpUpdateConfig())  # MTP head update settings


def flat_config(cfg: RLConfig) -> dict[str, Any]:
    """The config as one flat dict (what ``config.json`` holds and ``resolve_rl_config`` reads).

    Example:
        >>> flat_config(RLConfig())["mtp_update"]
        'frozen'
    """
    return flatten(cfg)


def config_fields() -> dict[str, Flag]:
    """Every flat key as a flag: its type, default and help text (``option``; the CLI's --help).

    Example:
        >>> config_fields()["mtp_lr"][:2]
        (<class 'float'>, 0.0001)
    """
    return flags_of(RLConfig)


def max_speculate_k(cfg: RLConfig) -> int:
    """The deepest K a rollout of the run may draft (``bebop.config.drafted_k``)."""
    return drafted_k(cfg.spec.mode, cfg.spec.speculate_k)


def _relation_problems(cfg: RLConfig) -> list[str]:
    """Why fields that are each usable cannot go together in a run (or, for the temperature, in RL)."""
    from bebop.rollout.base import backend_problem

    problems = [p for p in (positive_temperature("temperature", cfg.sampling.temperature),
                            backend_problem(cfg.backend, cfg.spec.mode, cfg.spec.speculate_k),
                            verify_problem(cfg.spec.mode, cfg.spec.verify, cfg.backend)) if p]
    if cfg.task == "math" and not cfg.data:
        problems.append("task math needs data (a JSONL/parquet prompt file)")
    if cfg.task == "embedded" and cfg.data:
        problems.append(f"task embedded uses its own prompts, so data {cfg.data!r} would be ignored; "
                        "use task math (implied by data when task is not set) or drop data")
    return problems


def check_rl_config(cfg: RLConfig) -> None:
    """Raises BebopError (one line) on a value no run could use: each field's own check
    (``bebop.config.field_problems``), then the rules that relate fields. The RL loop's door
    (``train_rl``), for a config built without ``resolve_rl_config``, which runs the same checks."""
    if problems := field_problems(cfg) + _relation_problems(cfg):
        raise BebopError("invalid rl config: " + "; ".join(problems))


def rollout_settings(cfg: RLConfig):
    """What the run's rollouts read, typed: a ``bebop.rollout.runner.RolloutSettings``."""
    from bebop.rollout.runner import RolloutSettings

    return RolloutSettings(
        sampling=cfg.sampling, spec=cfg.spec, group_size=cfg.group_size, seed=cfg.seed,
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
    values = merge_sources(file, overrides, flat_keys(RLConfig))
    if values.get("data") and "task" not in values:
        values["task"] = "math"  # a data file implies the file task
    cfg = resolve(RLConfig, None, values)  # NOTE: each field's check runs here, the rules that relate them below
    if problems := _relation_problems(cfg):
        raise BebopError("invalid rl config: " + "; ".join(problems))
    return cfg
