"""The policy's update from a scored rollout, in micro-batches: old logprobs, gradients, AdamW steps.

    old, ref = fixed_logprobs(sampler, reference, inputs, temperature, max_tokens)
    metrics = update_policy(policy, optimizer, inputs, old, ref, advantages, cfg, temperature)

The rows of a step (its B*G prompt + completion sequences, right-padded: ``bebop.rollout.logprobs.pad_sequences``)
go through the model in ``micro_batches`` of at most ``micro_batch_tokens`` padded tokens, each cut to
its longest row; log-probabilities come from ``bebop.rollout.logprobs.token_logprobs`` (the decoder, then a tiled
lm_head: no (rows, T, V) tensor). Every micro-batch's loss is divided by the whole step's token count
(summed over torchrun's ranks), so the gradients, losses and metrics of the micro-batches add up to the
one-batch ones: only memory depends on the budget (float rounding aside).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from bebop.rl.config import PolicyConfig
from bebop.rl.grpo import micro_batches, policy_loss
from bebop.rollout.logprobs import IGNORE_LOGPROB, token_logprobs
from bebop.utils import distributed
from bebop.utils.errors import BebopError


def row_lengths(inputs: tuple[torch.Tensor, ...]) -> list[int]:
    """Each row's real length, from the attention mask of (input_ids, attention_mask, completion_mask) (B, T);
    one host sync."""
    return inputs[1].sum(dim=1).tolist()


def _part(inputs: tuple[torch.Tensor, ...], rows: slice, lengths: list[int]) -> tuple[torch.Tensor, ...]:
    """The rows' tensors (b, T') cut to their longest row: rows are right-padded, so nothing real is cut."""
    width = max(lengths[rows])
    return tuple(t[rows, :width] for t in inputs)


@torch.no_grad()
def fixed_logprobs(sampler: nn.Module, reference: nn.Module | None, inputs, temperature: float, max_tokens: int):
    """Old logprobs (B*G, T) under the model that sampled, and reference logprobs (or None), computed
    ``micro_batches`` of at most ``max_tokens`` padded tokens at a time."""
    lengths = row_lengths(inputs)
    old = torch.full(inputs[0].shape, IGNORE_LOGPROB, dtype=torch.float32, device=inputs[0].device)
    ref = old.clone() if reference is not None else None
    for rows in micro_batches(lengths, max_tokens):
        part = _part(inputs, rows, lengths)
        width = part[0].shape[1]
        old[rows, :width] = token_logprobs(sampler, *part, temperature=temperature)
        if reference is not None:
            ref[rows, :width] = token_logprobs(reference, *part, temperature=temperature)
    return old, ref


def accumulate_gradients(
    policy: nn.Module,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # 3 x (B*G, T)
    old_logprobs: torch.Tensor,  # (B*G, T)
    ref_logprobs: torch.Tensor | None,  # (B*G, T)
    advantages: torch.Tensor,  # (B*G,)
    num_tokens: torch.Tensor,  # () the whole step's completion tokens (all ranks)
    cfg: PolicyConfig,
    temperature: float,
) -> dict[str, float]:
    """Adds the gradient of the batch's GRPO loss to the policy's ``.grad``, one micro-batch at a time.

    Each micro-batch's loss is normalised by ``num_tokens``, so the losses, their gradients and the
    metrics (each a sum over tokens / num_tokens) add up to the whole batch's: the metrics returned are
    those sums. Holds one micro-batch's activations at a time. Syncs: ``policy_loss``'s metrics and the
    loss, per micro-batch.
    """
    lengths = row_lengths(inputs)
    sums: dict[str, float] = {}
    for rows in micro_batches(lengths, cfg.micro_batch_tokens):
        part = _part(inputs, rows, lengths)
        width = part[0].shape[1]
        logprobs = token_logprobs(policy, *part, temperature=temperature)
        ref = ref_logprobs[rows, :width] if ref_logprobs is not None else None
        loss, metrics = policy_loss(logprobs, old_logprobs[rows, :width], advantages[rows], part[2], cfg.clip_eps,
                                    ref, cfg.kl_coef, num_tokens)
        loss.backward()
        for key, value in {**metrics, "rl/loss": loss.item()}.items():
            sums[key] = sums.get(key, 0.0) + value
    return sums


def update_policy(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],  # 3 x (B*G, T)
    old_logprobs: torch.Tensor,  # (B*G, T)
    ref_logprobs: torch.Tensor | None,  # (B*G, T)
    advantages: torch.Tensor,  # (B*G,)
    cfg: PolicyConfig,
    temperature: float,
) -> dict[str, float]:
    """``update_epochs`` AdamW steps of the GRPO loss on the whole batch; returns the metrics' epoch means.

    Each step's gradient is accumulated over micro-batches of at most ``cfg.micro_batch_tokens`` padded
    tokens (``accumulate_gradients``), so it is the one-batch gradient. Under torchrun the rows are this
    rank's: the loss is normalised by the global token count and the gradients (and metrics) are summed
    over ranks, so every rank takes the one-process step.
    """
    params = [p for p in policy.parameters() if p.requires_grad]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
    advantages = advantages.to(old_logprobs.device)
    # NOTE: the whole step's count normalises every micro-batch's loss on every rank
    num_tokens = distributed.sum_tensor(inputs[2].sum().to(old_logprobs.dtype)).clamp(min=1.0)
    history: list[dict[str, float]] = []
    for _ in range(cfg.update_epochs):
        optimizer.zero_grad(set_to_none=True)
        metrics = accumulate_gradients(policy, inputs, old_logprobs, ref_logprobs, advantages, num_tokens, cfg,
                                       temperature)
        distributed.sum_gradients(params)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if not math.isfinite(float(grad_norm)):  # NOTE: a NaN step would poison every weight; sync per epoch
            raise BebopError(f"the policy loss ({metrics['rl/loss']:.3g}) has a non-finite gradient (norm "
                             f"{float(grad_norm)}); scale the rewards down (nothing was written for this step)")
        optimizer.step()
        metrics = distributed.sum_floats(metrics)  # sync per epoch
        history.append({**metrics, "rl/grad_norm": float(grad_norm)})
    optimizer.zero_grad(set_to_none=True)  # frees the gradients until the next step
    return {key: sum(h[key] for h in history) / len(history) for key in history[0]}
