"""The GRPO loop with speculative rollouts: ``rl_step`` (one step) and ``train_rl`` (a run).

One step, top-down (``rl_step``)::

    rollout       RolloutRunner     the backend (``bebop.rollout``: engine or vLLM; mode none|to|rs),
                                    G samples per prompt; on the engine, row b*G+g is seeded by
                                    (seed, step, b*G+g) only
    reward        score_rollout     the reward function on the decoded completions
    advantages    group_advantages  within each prompt's G samples
    old logprobs  fixed_logprobs    of the sampled tokens under the sampling policy (and the reference)
    loss, update  update_policy     update_epochs x (policy_loss, backward, clip, AdamW step)
    head          update_head       one online step of the MTP head (mtp_update == "online")
    sync          RolloutRunner     the backend samples the next step with the updated weights
    log           step_metrics      one flat dict per step; token_stats_row for token_stats.jsonl

Deviations from textbook GRPO (beyond the numbered list in ``bebop.rl.grpo``):
  1) Rollouts are speculative, yet every emitted token is distributed exactly as the policy:
     ``rs`` accepts with min(1, p/q) and ``to`` is the same rule with a one-hot q. The loss never
     sees the drafts; old logprobs are recomputed after the rollout (``fixed_logprobs``).
  2) Top-k/top-p shape the rollout's distribution only; the loss's logprobs are those of the
     unfiltered, temperature-scaled policy (as in common GRPO code). With the defaults (off) the
     two coincide.
  3) The policy stays in eval mode: the engine needs it, and Qwen-family models have no dropout,
     so train mode would compute the same function.
  4) The MTP head. ``frozen``: its own weights never change, but it is attached to the policy
     object, so it always reads the *current* policy's hidden states, embedding and lm_head; the
     draft drifts from the target only because the policy changes (the paper's setting, §5).
     ``online``: ``bebop.rl.online`` trains it after the policy update of each step, on that
     step's sequences, so it adapts to the policy that samples next.
  5) ``async_rollout`` is one step off-policy: the rollout of step s+1 is sampled in a background
     thread by a *snapshot* of (policy, head) taken before the update of step s, while step s
     updates (``bebop.rollout.runner``). Old logprobs are the snapshot's (the policy that really
     sampled), so the clipped ratio pi_theta / pi_snapshot corrects for the lag. The snapshot costs
     one extra copy of the weights; it is saved in checkpoints, so a resumed async run on the engine
     regenerates the in-flight rollout bit for bit. On CUDA both threads use the default stream:
     correct, and the overlap comes from the host side (the engine's Python loop and kernel launches).
  6) Full-batch updates: each of the update_epochs is one optimizer step on all B*G rows, its gradient
     accumulated over micro-batches of at most ``micro_batch_tokens`` padded tokens (old and reference
     logprobs and the online head step are computed in the same micro-batches). The logprobs come from
     the policy's decoder and a tiled lm_head (``bebop.rollout.logprobs.token_logprobs``): no (rows, T, V) tensor.
  7) ``backend vllm``: rollouts are not seeded per row (vLLM cannot seed requests that draft), so a
     run does not repeat bit for bit; ``spec/alpha_*``, ``spec/accept_length_hist``,
     ``spec/accepted_per_pos`` and ``target_entropy`` are null (vLLM does not expose the
     distributions), and ``spec/verifier_*`` are vLLM's own counters (docs/vllm.md).
  8) Under torchrun (engine backend only) each rank samples 1/W of the prompts (``RolloutRunner``);
     every rank then holds the whole rollout, scores it and computes the advantages, but computes
     logprobs and gradients on its own rows only; the loss is normalised by the global token
     count and gradients are summed over ranks, so the update is the one-process update. The
     online head step runs on every rank on the whole rollout (the same step everywhere). Rank 0
     alone writes the run directory.
  9) ``mode``/``speculate_k`` ``auto`` (``bebop.config.is_auto``; ``bebop.speculative.auto``): on the
     chooser's schedule (``AutoChooser.should_probe``: the run's first step, or the first after a
     resume, and every ``auto_every`` steps after) the rollout probes settings for a few decode
     steps each, timed afresh, and then runs the one with the highest predicted tokens/s; a step in between runs
     that choice, without probe steps or pricing (``AutoChooser.held``); a setting chosen for the
     first time is confirmed by a probe in the next step (``AutoChooser.settle``). Tokens stay
     exactly the policy's, but the choice depends on timings, so such a run does not repeat bit for
     bit. Each
     row logs ``auto/mode``, ``auto/speculate_k``, ``auto/predicted_tok_s``, ``auto/measured_tok_s``
     (the decode steps after the choice), ``auto/probed`` (False: the last probe's choice kept) and
     ``auto/confirmed`` (False: a setting's first choice, the next step probes to confirm it).
     Under torchrun auto is refused (each rank would time, hence choose, on its own).
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from bebop.rl.checkpoint import has_checkpoint, load_checkpoint, save_checkpoint
from bebop.rl.config import RESUME_MAY_CHANGE, RLConfig, check_rl_config, flat_config, rollout_settings
from bebop.rl.grpo import group_advantages
from bebop.rl.online import make_head_optimizer, online_head_step, rollout_sequences
from bebop.rl.prompts import check_embedded_prompts, load_task_rows, prompt_batch, task_reward
from bebop.rl.rewards import RewardFn, call_reward
from bebop.rl.update import fixed_logprobs, update_policy
from bebop.rollout.base import backend_problem, make_backend
from bebop.rollout.logprobs import pad_sequences
from bebop.rollout.runner import PromptBatch, Rollout, RolloutRunner, frozen_copy
from bebop.speculative.settings import head_problem
from bebop.utils import distributed
from bebop.utils.errors import BebopError
from bebop.utils.files import write_json
from bebop.utils.metric_log import JsonlLogger, NullLogger, log_rows_until
from bebop.utils.optim import make_adamw
from bebop.utils.outputs import check_output_dir, output_dir
from bebop.utils.progress import progress, say, step_line
from bebop.utils.run_files import CONFIG_FILE, METRICS_FILE, TOKEN_STATS_FILE, json_safe, token_stats_row
from bebop.utils.torch_utils import seed_everything

BACKEND_DIR = "backend"  # what a rollout backend writes once (vLLM: the served model directory)


@dataclass
class RLState:
    """Everything ``rl_step`` reads and changes (mutable run state, not configuration)."""

    policy: nn.Module  # the HF causal LM being trained (eval mode, requires_grad on)
    tokenizer: Any  # its tokenizer (pad/EOS ids, decoding)
    head: nn.Module | None  # the MtpHead attached to ``policy``; None only in mode none
    optimizer: torch.optim.Optimizer  # AdamW over the policy's parameters
    reward_fn: RewardFn  # reward(prompts, completions, **fields) -> list[float]
    head_optimizer: torch.optim.Optimizer | None = None  # AdamW over the head (online only)
    reference: nn.Module | None = None  # frozen copy of the initial policy (kl_coef > 0 only)
    rollouts: RolloutRunner | None = None  # samples each step's rollout (backend, async snapshot, weight sync)

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        return next(i for i in (tok.pad_token_id, tok.eos_token_id, 0) if i is not None)


# ------------------------------------------------------------------------------ reward


def score_rollout(reward_fn: RewardFn, rollout: Rollout, group_size: int) -> torch.Tensor:  # (B*G,)
    """Rewards of every row; prompts and extra fields are repeated G times to line up with rows."""
    batch = rollout.batch
    prompts = [p for p in batch.prompts for _ in range(group_size)]
    fields = {k: [v for v in values for _ in range(group_size)] for k, values in batch.fields.items()}
    try:
        rewards = call_reward(reward_fn, prompts, rollout.result.texts, **fields)
    except ValueError as e:
        raise BebopError(f"step {batch.step + 1}: {e}") from None
    out = torch.tensor(rewards, dtype=torch.float32)
    if not bool(torch.isfinite(out).all()):
        name = getattr(reward_fn, "__name__", type(reward_fn).__name__)
        raise BebopError(f"step {batch.step + 1}: reward function {name} returned {max(rewards, key=abs):.3g}, beyond "
                         "float32's range; scale the rewards down (nothing was updated or written for this step)")
    return out


def check_advantages(reward_fn: RewardFn, rewards: torch.Tensor, advantages: torch.Tensor, step: int) -> None:
    """Raises BebopError (one line naming the reward) unless the advantages (B*G,) of the rewards (B*G,)
    are finite: a spread whose square overflows float32 would make the update NaN."""
    if bool(torch.isfinite(advantages).all()):  # sync point, once a step
        return
    name = getattr(reward_fn, "__name__", type(reward_fn).__name__)
    top = rewards.abs().max().item()
    raise BebopError(f"step {step + 1}: reward function {name} gave rewards up to {top:.3g} in magnitude, whose "
                     "group advantages are not finite in float32; scale the rewards down (nothing was updated or "
                     "written for this step)")


# ------------------------------------------------------------------------------ loss and updates


def sequence_tensors(rollout: Rollout, pad_id: int, device: torch.device):
    """(input_ids, attention_mask, completion_mask), each (B*G, T), of prompt + completion rows."""
    ids, attn, comp = pad_sequences(rollout.result.prompt_ids, rollout.result.token_ids, pad_id)
    return ids.to(device), attn.to(device), comp.to(device)


NO_HEAD_METRICS = {"mtp/loss": None, "mtp/grad_norm": None, "mtp/num_chains": None, "mtp/alpha_rs": None}


def update_head(state: RLState, rollout: Rollout, cfg: RLConfig) -> dict:
    """One online step of the head on the rollout (``bebop.rl.online``); nulls when the head is frozen."""
    if state.head_optimizer is None:
        return dict(NO_HEAD_METRICS)
    sequences = rollout_sequences(rollout.result.prompt_ids, rollout.result.token_ids)
    return online_head_step(state.policy, state.head, state.head_optimizer, sequences, cfg.mtp, cfg.sampling.temperature,
                            state.pad_id, cfg.policy.micro_batch_tokens)


# ------------------------------------------------------------------------------ metrics


def step_metrics(cfg: RLConfig, rollout: Rollout, rewards: torch.Tensor, update: dict, seconds: dict) -> dict:
    """The metrics.jsonl row of a step: reward, acceptance (``spec/*``, null in mode none), loss, time.

    ``accuracy`` is the share of rewards > 0.5 (for 0/1 rewards, the share that are 1).
    """
    result = rollout.result
    spec = result.spec_metrics()
    target_entropy = spec.pop("spec/target_entropy")
    if cfg.spec.mode == "none":
        spec = dict.fromkeys(spec)
    num_tokens = sum(result.lengths)
    row = {
        "step": rollout.batch.step + 1,
        "mode": cfg.spec.mode,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(correction=0)),
        "accuracy": float((rewards > 0.5).float().mean()),
        "target_entropy": target_entropy,
        **spec,
        "completion_len_mean": num_tokens / len(result.lengths),
        "num_tokens": num_tokens,
        **update,
        **seconds,
        "tokens_per_s": num_tokens / max(rollout.seconds, 1e-9),
    }
    if rollout.decision is not None:  # mode/K auto: the setting chosen, its prediction beside its measured rate
        row.update(rollout.decision.to_metrics(), **{"auto/measured_tok_s": rollout.decision.measured_tok_s})
    return json_safe(row)


# ------------------------------------------------------------------------------ one step


def rl_step(
    state: RLState, batch: PromptBatch, cfg: RLConfig, next_batch: PromptBatch | None = None
) -> tuple[dict, Rollout]:
    """One GRPO step: rollout -> reward -> advantages -> old logprobs -> update -> head -> metrics.

    Args:
        state: the run state (``make_state``); the policy, optimizers and async snapshot change.
        batch: this step's prompts.
        cfg: the run's config.
        next_batch: the next step's prompts; with ``async_rollout`` its rollout starts in the
            background before this step's update (ignored otherwise).

    Returns:
        ``(metrics, rollout)``: the metrics.jsonl row, and the rollout (for token statistics).
    """
    start = time.perf_counter()
    rollout, wait_s = state.rollouts.collect(batch)
    rewards = score_rollout(state.reward_fn, rollout, cfg.group_size)
    advantages = group_advantages(rewards, cfg.group_size, scale=not cfg.policy.mean_only)
    check_advantages(state.reward_fn, rewards, advantages, batch.step)
    train_start = time.perf_counter()
    inputs = sequence_tensors(rollout, state.pad_id, next(state.policy.parameters()).device)
    first, last = (n * cfg.group_size for n in distributed.shard_range(len(rollout.batch.prompts), "prompts_per_step"))
    if distributed.world_size() > 1:  # NOTE: this rank's rows, padded as in the whole batch
        inputs, advantages = tuple(t[first:last] for t in inputs), advantages[first:last]
    old_logprobs, ref_logprobs = fixed_logprobs(state.rollouts.sampling_model, state.reference, inputs,
                                                cfg.sampling.temperature, cfg.policy.micro_batch_tokens)
    state.rollouts.launch(next_batch)
    update = update_policy(state.policy, state.optimizer, inputs, old_logprobs, ref_logprobs, advantages, cfg.policy,
                           cfg.sampling.temperature)
    mtp_start = time.perf_counter()
    update.update(update_head(state, rollout, cfg))
    sync_start = time.perf_counter()
    state.rollouts.updated()  # the backend samples the next step with the new weights (vLLM: copied in place)
    end = time.perf_counter()
    seconds = {"rollout_s": rollout.seconds, "rollout_wait_s": wait_s, "train_s": mtp_start - train_start,
               "mtp_s": sync_start - mtp_start, "sync_s": end - sync_start, "step_s": end - start}
    return step_metrics(cfg, rollout, rewards, update, seconds), rollout


# ------------------------------------------------------------------------------ a run


def make_state(model: nn.Module, tokenizer, head: nn.Module | None, cfg: RLConfig,
               backend_options: dict[str, Any] | None = None) -> RLState:
    """Prepares a run: trainable policy, optimizers, frozen or trainable head, reference, rollout backend.

    ``backend_options`` go to the backend's constructor (the vLLM backend's ``workdir``, say).
    """
    if problem := head_problem(cfg.spec.mode, head is not None, cfg.mtp.mtp_update):
        raise BebopError(problem)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(True)
    # NOTE: a bfloat16 policy is updated through float32 master weights (bebop.utils.optim)
    optimizer = make_adamw(model.parameters(), lr=cfg.policy.lr, weight_decay=cfg.policy.weight_decay)
    head_optimizer = None
    if head is not None:
        head.eval()
        online = cfg.mtp.mtp_update == "online"
        for p in head.parameters():
            p.requires_grad_(online)
        head_optimizer = make_head_optimizer(head, cfg.mtp) if online else None
    reference = frozen_copy(model) if cfg.policy.kl_coef > 0 else None
    backend = make_backend(cfg.backend, model, tokenizer, head, seed=cfg.seed, **(backend_options or {}))
    return RLState(
        policy=model, tokenizer=tokenizer, head=head, optimizer=optimizer, reward_fn=task_reward(cfg),
        head_optimizer=head_optimizer, reference=reference,
        rollouts=RolloutRunner(backend, model, head, rollout_settings(cfg)),
    )


def close_state(state: RLState) -> None:
    """Waits for a rollout in flight, stops the background thread and closes the backend."""
    if state.rollouts is not None:
        state.rollouts.close()


def checkpoint_components(state: RLState) -> dict[str, Any]:
    """Everything a resumed run needs to continue bit for bit, by checkpoint file name."""
    parts: dict[str, Any] = {"policy": state.policy, "policy_optimizer": state.optimizer}
    if state.head_optimizer is not None:
        parts.update(head=state.head, head_optimizer=state.head_optimizer)
    if state.reference is not None:
        parts["reference"] = state.reference
    parts.update(state.rollouts.checkpoint_parts())
    return parts


def _start_step(state: RLState, run_dir: Path, config: dict, resume: bool) -> int:
    """0, or the step of the checkpoint a resumed run continues from."""
    if not resume:
        return 0
    if not has_checkpoint(run_dir):
        say(f"rl: no checkpoint in {run_dir}; starting from step 0")
        return 0
    step = load_checkpoint(run_dir, checkpoint_components(state), config, RESUME_MAY_CHANGE)
    state.rollouts.resumed()
    return step


def _line(row: dict) -> dict:
    """The values of the fixed-format step line."""
    return {"reward": row["reward_mean"], "acc": row["accuracy"], "accept": row["spec/accept_length"] or "-",
            "H": row["target_entropy"] if row["target_entropy"] is not None else "-", "loss": row["rl/loss"], "step_s": row["step_s"]}


def train_rl(
    model: nn.Module,
    tokenizer,
    head: nn.Module | None,
    cfg: RLConfig,
    run_dir: str | Path,
    resume: bool = False,
    show_progress: bool = True,
    overwrite: bool = False,
    run_info: dict[str, Any] | None = None,
) -> list[dict]:
    """Runs GRPO for ``cfg.steps`` steps and writes the run directory.

    Writes ``config.json`` (flat resolved config), ``metrics.jsonl`` (one row per step),
    ``token_stats.jsonl`` (modes to/rs) and ``checkpoint/`` every ``cfg.save_every`` steps and at
    the end. With ``resume`` it continues from ``checkpoint/`` (policy, optimizers, head, snapshot,
    RNG) and drops log rows written after it (and a torn last line), so the files match a run that
    never stopped. Everything (config, prompt rows, checkpoint, logs) is checked before the run
    directory is created or changed.

    Args:
        model: the policy, an HF causal LM; trained in place.
        tokenizer: its tokenizer.
        head: an ``MtpHead`` attached to ``model`` (modes to/rs, or mtp_update online), else None.
        cfg: the resolved config.
        run_dir: the run directory (created). A non-empty one needs ``resume`` or ``overwrite``.
        resume: continue from ``run_dir/checkpoint`` when it exists.
        show_progress: show a progress bar with ETA.
        overwrite: move a non-empty ``run_dir`` aside to ``NAME.old-<timestamp>`` and start afresh.
        run_info: what else the run needs to be resumed (the CLI's model and head paths), saved in
            ``config.json`` with the config; a resumed run must give the same values.

    Returns:
        The metrics rows of the steps run by this call.
    """
    check_rl_config(cfg)
    distributed.shard_range(cfg.prompts_per_step, "prompts_per_step")
    if problem := backend_problem(cfg.backend, cfg.spec.mode, cfg.spec.speculate_k, distributed.world_size()):
        raise BebopError(problem)
    run_dir = Path(run_dir)
    check_output_dir(run_dir, resume=resume, overwrite=overwrite, what="run directory")
    config = {**flat_config(cfg), **(run_info or {})}
    seed_everything(cfg.seed)
    # NOTE: a backend writes its files (vLLM: the served model) only when it first samples, after the checks.
    state = make_state(model, tokenizer, head, cfg, backend_options={"workdir": run_dir / BACKEND_DIR})
    rows_out: list[dict] = []
    loggers: list[JsonlLogger | NullLogger] = []
    held = contextlib.ExitStack()  # NOTE: holds the run directory (``output_dir``) until the run ends
    failure: BaseException | None = None
    try:
        data_rows = _checked_prompts(cfg, tokenizer, model, state.reward_fn)
        start = _start_step(state, run_dir, config, resume)
        kept = {name: log_rows_until(run_dir / name, start, what=name) if resume else []
                for name in (METRICS_FILE, TOKEN_STATS_FILE)}
        distributed.barrier()  # NOTE: every rank has read the checkpoint and logs before rank 0 writes
        main = distributed.is_main()
        # NOTE: nothing above writes; from here on the run directory changes.
        if main:
            held.enter_context(output_dir(run_dir, resume=resume, overwrite=overwrite, what="run directory",
                                          announce=say, worth_keeping=lambda _: bool(rows_out)))
            write_json(run_dir / CONFIG_FILE, config)
        say(f"rl: resolved config {json.dumps(config)}")
        say(f"rl: mode={cfg.spec.mode} steps={cfg.steps} B={cfg.prompts_per_step} G={cfg.group_size} from step {start}")
        metrics_log = JsonlLogger(run_dir / METRICS_FILE, kept[METRICS_FILE]) if main else NullLogger()
        token_log = (JsonlLogger(run_dir / TOKEN_STATS_FILE, kept[TOKEN_STATS_FILE])
                     if main and cfg.spec.mode != "none" and state.rollouts.backend.token_stats else NullLogger())
        loggers += [metrics_log, token_log]
        label = cfg.label or cfg.spec.mode
        for step in progress(range(start, cfg.steps), total=cfg.steps - start, desc=f"rl {label}",
                             enabled=show_progress):
            batch = prompt_batch(cfg, step, data_rows)
            next_batch = prompt_batch(cfg, step + 1, data_rows) if step + 1 < cfg.steps else None
            row, rollout = rl_step(state, batch, cfg, next_batch)
            metrics_log.log(row)
            token_log.log(token_stats_row(rollout.batch.step + 1, rollout.result.stats.token_arrays()))
            rows_out.append(row)
            say(step_line("rl", step + 1, cfg.steps, _line(row)))
            if main and ((cfg.save_every and (step + 1) % cfg.save_every == 0) or step + 1 == cfg.steps):
                save_checkpoint(run_dir, checkpoint_components(state), step + 1, config)
        distributed.barrier()  # NOTE: no rank returns before the last checkpoint is on disk
    except BaseException as error:
        failure = error
        raise
    finally:
        close_state(state)
        for logger in loggers:
            logger.close()
        # NOTE: after the close, since a backend (vLLM) writes inside the run directory. A failure hands
        # output_dir its exception: a fresh run whose first step failed is removed (and the run that
        # --overwrite moved aside put back); a run with a logged step is kept for --resume.
        if failure is None:
            held.close()
        else:
            held.__exit__(type(failure), failure, failure.__traceback__)
    return rows_out


def _checked_prompts(cfg: RLConfig, tokenizer, model: nn.Module, reward_fn: RewardFn) -> list[dict] | None:
    """The data rows (None for the embedded task), every prompt of the run checked to fit the model."""
    max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    rows = load_task_rows(cfg, tokenizer, max_positions, reward_fn)
    if rows is None:
        check_embedded_prompts(cfg, tokenizer, max_positions)
    return rows
