"""Online MTP head update during RL: train the draft head on each rollout batch (paper §5).

The paper's recipe keeps the head frozen during RL (``mtp_update = "frozen"``); this module is
the alternative it tested (§6.3): after the policy update of a step, the head takes one AdamW step
of a draft loss (``online_loss``) on that step's prompt + completion sequences, with its own
learning rate and its own gradient-norm clip (§5.3, "separate learning rates and separate
gradient-norm normalisation").

How it differs from ``bebop.mtp.train`` (offline head training):
  1) The backbone is the *current policy*, not a frozen model: ``chain_loss`` reads its hidden
     states and target logits under ``no_grad``, and the head also shares the policy's embedding
     and lm_head. ``loss.backward(inputs=head params)`` accumulates gradients into the head's own
     parameters only, so no gradient, not even a ``.grad`` buffer, ever reaches the policy.
  2) One optimizer step per RL step on the full rollout batch (its gradient accumulated over the RL
     step's micro-batches); no warmup.
  3) Chains start at every completion position (``start`` = the prompt length), as in serving:
     the head only ever drafts inside completions.
"""

from __future__ import annotations

import torch
from torch import nn

from bebop.mtp.data import Sequences
from bebop.mtp.loss import chain_loss, chain_loss_count
from bebop.rl.config import MICRO_BATCH_TOKENS, MtpUpdateConfig
from bebop.rl.grpo import micro_batches
from bebop.utils.optim import make_adamw


def make_head_optimizer(head: nn.Module, cfg: MtpUpdateConfig) -> torch.optim.Optimizer:
    """AdamW over the head's own parameters (the shared embedding/lm_head are not among them); a bfloat16
    head gets float32 master weights (``bebop.utils.optim``)."""
    return make_adamw(head.parameters(), lr=cfg.mtp_lr, weight_decay=0.0)


def rollout_sequences(prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> Sequences:
    """Prompt + completion of every rollout row, drafting from the first completion token.

    Example:
        >>> s = rollout_sequences([[5, 6]], [[7, 8, 9]])
        >>> s.token_ids, s.starts
        ([[5, 6, 7, 8, 9]], [2])
    """
    return Sequences([list(p) + list(c) for p, c in zip(prompt_ids, completion_ids)], [len(p) for p in prompt_ids])


def online_head_step(
    backbone: nn.Module,
    head: nn.Module,
    optimizer: torch.optim.Optimizer,
    sequences: Sequences,
    cfg: MtpUpdateConfig,
    temperature: float,
    pad_id: int,
    max_tokens: int = MICRO_BATCH_TOKENS,
) -> dict[str, float | list[float]]:
    """One AdamW step of the head on a batch of rollout sequences; the policy is left untouched.

    The gradient is accumulated over ``micro_batches`` of at most ``max_tokens`` padded tokens: each
    micro-batch's loss is weighted by the chains (or entries) it averages over (``chain_loss_count``) and
    the sum divided by the batch's count, so the step is the one-batch step.

    Args:
        backbone: the policy (an HF causal LM) the head is attached to; only read.
        head: the ``MtpHead`` being trained.
        optimizer: the head's optimizer (``make_head_optimizer``).
        sequences: the rollout's prompt + completion tokens (``rollout_sequences``).
        cfg: ``online_loss``, ``mtp_grad_clip`` and ``mtp_speculate_k`` are read.
        temperature: the rollout temperature; p and q of the loss are softmax(logits / T).
        pad_id: id for right padding (never scored: ``chain_loss`` masks past each length).
        max_tokens: padded tokens per micro-batch (the RL run's ``micro_batch_tokens``).

    Returns:
        ``mtp/loss``, ``mtp/grad_norm``, ``mtp/num_chains`` and ``mtp/alpha_rs`` (per draft step,
        measured on this batch *before* the update). The floats are host syncs, once per RL step.
    """
    device = next(backbone.parameters()).device
    params = [p for p in head.parameters() if p.requires_grad]
    if not params:
        raise ValueError("online_head_step: the head has no trainable parameters (requires_grad is off)")
    # NOTE: the engine's draft context (bebop.mtp.chains) for one-layer heads, as train-mtp trains them.
    context = "served" if len(head.layers) == 1 else "unrolled"
    optimizer.zero_grad(set_to_none=True)
    loss_sum = count = torch.zeros((), device=device)
    alpha_sums = torch.zeros(2, cfg.mtp_speculate_k, device=device)  # (2, K): sum of alpha_rs, valid entries
    for rows in micro_batches([len(t) for t in sequences.token_ids], max_tokens):
        ids, lengths, starts = sequences.batch(list(range(rows.start, rows.stop)), pad_id, device)
        # NOTE: fused with the policy's lm_head (bebop.mtp.loss), whose weight it reads detached.
        loss, alpha_rs, mask = chain_loss(backbone, head, ids, lengths, starts, cfg.mtp_speculate_k, context,
                                          cfg.online_loss, temperature)  # alpha_rs (N, K): before the update
        part = chain_loss_count(cfg.online_loss, mask)
        # NOTE: inputs=params keeps every gradient inside the head; the policy's shared embedding and
        # lm_head are on the graph but get no .grad.
        (loss * part).backward(inputs=params)
        loss_sum, count = loss_sum + loss.detach() * part, count + part
        alpha_sums += torch.stack([(alpha_rs * mask).sum(0), mask.sum(0)])
    num_chains = int(alpha_sums[1, 0])  # sync: once per step (every chain has its first step)
    if num_chains == 0:  # every completion too short to hold one verified draft step
        return {"mtp/loss": None, "mtp/grad_norm": None, "mtp/num_chains": 0, "mtp/alpha_rs": None}
    for p in params:  # the sum of the micro-batches' weighted losses -> the batch's mean
        if p.grad is not None:
            p.grad.div_(count)
    max_norm = cfg.mtp_grad_clip if cfg.mtp_grad_clip > 0 else float("inf")
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    optimizer.step()
    return {
        "mtp/loss": (loss_sum / count).item(),
        "mtp/grad_norm": float(grad_norm),
        "mtp/num_chains": num_chains,
        "mtp/alpha_rs": (alpha_sums[0] / alpha_sums[1].clamp_min(1)).tolist(),
    }
