"""Pure tensor pieces of one GRPO step: group advantages, token logprobs, the clipped loss.

GRPO (Shao et al. 2024) as used by arXiv 2606.12370 §1.4:

    J(θ) = E_x[ (1/G) Σ_i (1/|y_i|) Σ_t min(r_{i,t} Â_i, clip(r_{i,t}, 1−ε, 1+ε) Â_i) ]
    r_{i,t} = π_θ(y_{i,t} | x, y_{i,<t}) / π_θold(y_{i,t} | x, y_{i,<t})
    Â_i = (R_i − μ_G) / σ_G   (mean and std over the G samples of prompt x)

The step reads top-down: rollout -> reward -> ``group_advantages`` -> ``bebop.rollout.logprobs.token_logprobs``
(old, reference, current) -> ``policy_loss`` -> update. Nothing here knows how rollouts were produced.

Deviations from textbook GRPO:
  1) Token-level normalisation (DAPO, Yu et al. 2025): the surrogate is summed over every valid
     completion token of the batch and divided by the number of such tokens, instead of the
     paper's per-sequence mean (1/|y_i|) followed by a mean over sequences. Long completions
     therefore weigh in proportion to their length, and a token's gradient does not shrink
     because its sequence is long.
  2) Old logprobs are recomputed by the policy (``token_logprobs`` under ``torch.no_grad``)
     after the rollout, not taken from the sampler, so r = 1 exactly at the first update
     whatever numerical differences the inference engine has.
  3) Rollouts are speculative but need no importance correction: rejection sampling accepts a
     draft token with probability min(1, p/q) and otherwise resamples from norm(max(0, p − q)),
     which makes every emitted token distributed exactly as the policy p.
  4) ``scale=False`` in ``group_advantages`` gives the mean-only advantage of Dr. GRPO
     (Liu et al. 2025); the standard deviation is the population one (see that function).
  5) Optional KL penalty to a frozen reference with the k3 estimator (Schulman 2020), added to
     the loss with the same token-level normalisation; the paper's runs do not state one.
"""

from __future__ import annotations

import torch
from torch import nn



def group_advantages(
    rewards: torch.Tensor,  # (B*G,)
    group_size: int,
    scale: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:  # (B*G,)
    """Normalises rewards within each prompt's group of samples.

    Rows are prompt-major: rows ``[b*G, (b+1)*G)`` are the G samples of prompt b. The standard
    deviation is the population one (divide by G, not G−1): the group is the whole set being
    normalised, not a sample of it, so the advantages of a group have unit RMS exactly and a
    binary group with one success out of two gives ±1, not ±0.71.

    Example:
        >>> group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), group_size=4, eps=0.0)
        tensor([ 1., -1., -1.,  1.])

    Args:
        rewards: scalar reward of every sample, prompt-major.
        group_size: G, samples per prompt.
        scale: divide by the group's std + eps (GRPO); False keeps only the mean (Dr. GRPO).
        eps: added to the std so zero-variance groups give zero advantages, not NaN.

    Returns:
        Advantage of every sample, same order and dtype as ``rewards`` (float).
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D (B*G,), got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)  # (B, G)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if scale:
        centred = centred / (grouped.std(dim=1, keepdim=True, correction=0) + eps)
    return centred.reshape(-1)


def micro_batches(lengths: list[int], max_tokens: int) -> list[slice]:
    """Consecutive rows in groups whose padded size (rows x the group's longest row) fits ``max_tokens``.

    A row longer than ``max_tokens`` forms a group of its own. The groups' losses add up to the
    batch's when each is normalised by the whole batch's token count (``policy_loss``'s ``num_tokens``).

    Example:
        >>> micro_batches([3, 3, 5, 2], max_tokens=10)
        [slice(0, 2, None), slice(2, 4, None)]

    Args:
        lengths: each row's real length (prompt + completion, without padding).
        max_tokens: the budget of padded tokens per group, >= 1.

    Returns:
        Row slices covering every row once, in order.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    groups, start, longest = [], 0, 0
    for row, length in enumerate(lengths):
        if row > start and (row - start + 1) * max(longest, length) > max_tokens:
            groups.append(slice(start, row))
            start, longest = row, 0
        longest = max(longest, length)
    if lengths:
        groups.append(slice(start, len(lengths)))
    return groups


def kl_k3(
    logprobs: torch.Tensor,  # (B, T)
    ref_logprobs: torch.Tensor,  # (B, T)
) -> torch.Tensor:  # (B, T)
    """Per-token k3 estimate of KL(π_θ ‖ π_ref) from tokens sampled by π_θ (Schulman 2020).

    k3 = exp(ref − logp) − (ref − logp) − 1, which is ≥ 0 (since e^x ≥ 1 + x), zero when
    the two logprobs agree, and unbiased for the KL when the token was drawn from π_θ.

    Example:
        >>> kl_k3(torch.tensor([[0.0]]), torch.tensor([[0.0]]))
        tensor([[0.]])

    Args:
        logprobs: policy logprobs of the sampled tokens.
        ref_logprobs: frozen reference logprobs of the same tokens.

    Returns:
        Per-token KL estimate (not masked; the caller masks).
    """
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(f"shape mismatch: {tuple(logprobs.shape)} vs {tuple(ref_logprobs.shape)}")
    log_ratio = ref_logprobs - logprobs
    return torch.exp(log_ratio) - log_ratio - 1.0


def _check_loss_inputs(
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,)
    mask: torch.Tensor,  # (B, T)
    ref_logprobs: torch.Tensor | None,  # (B, T)
    kl_coef: float,
) -> None:
    """Raises ValueError with a message when ``policy_loss`` inputs disagree in shape."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = tuple(logprobs.shape)
    others = {"old_logprobs": old_logprobs, "mask": mask, "ref_logprobs": ref_logprobs}
    for name, tensor in others.items():
        if tensor is not None and tuple(tensor.shape) != shape:
            raise ValueError(f"{name} shape {tuple(tensor.shape)} != logprobs {shape}")
    if tuple(advantages.shape) != shape[:1]:
        raise ValueError(f"advantages must be (B,) = {shape[:1]}, got {tuple(advantages.shape)}")
    if kl_coef != 0.0 and ref_logprobs is None:
        raise ValueError(f"kl_coef={kl_coef} needs ref_logprobs")


def policy_loss(
    logprobs: torch.Tensor,  # (B, T)
    old_logprobs: torch.Tensor,  # (B, T)
    advantages: torch.Tensor,  # (B,)
    mask: torch.Tensor,  # (B, T)
    clip_eps: float = 0.2,
    ref_logprobs: torch.Tensor | None = None,  # (B, T)
    kl_coef: float = 0.0,
    num_tokens: torch.Tensor | None = None,  # ()
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped-ratio GRPO surrogate with DAPO-style token-level normalisation, plus optional KL.

    loss = −Σ_{b,t} m_{b,t} min(r A_b, clip(r, 1−ε, 1+ε) A_b) / Σ m  +  β Σ m k3 / Σ m,
    with r = exp(logprobs − old_logprobs). The paper averages per sequence first (1/|y_i|),
    then over sequences; here every valid token of the batch weighs the same (deviation 1 of
    the module docstring). Gradients flow only through ``logprobs``: the old and reference
    logprobs are detached.

    Example (r = 1, no KL): two rows with advantages (1, −1) and 3 and 1 valid tokens give
    loss = −(3·1 + 1·(−1)) / 4 = −0.5.

    Args:
        logprobs: current policy logprobs of the sampled tokens (with grad).
        old_logprobs: logprobs of the same tokens under the policy that sampled them.
        advantages: one advantage per row, broadcast over its tokens.
        mask: True (or 1) on the tokens that count (the completion).
        clip_eps: ε of the ratio clip.
        ref_logprobs: frozen reference logprobs; needed when ``kl_coef`` != 0.
        kl_coef: β, weight of the k3 KL penalty.
        num_tokens: the normaliser Σ m; None counts this batch's valid tokens. Micro-batches and
            data-parallel ranks pass the whole step's count, so their losses (and metrics) add up to
            the whole batch's.

    Returns:
        ``(loss, metrics)``: the scalar loss, and floats ``rl/policy_loss``,
        ``rl/clip_fraction`` (share of tokens whose clip binds, i.e. gets no gradient),
        ``rl/ratio_mean`` and ``rl/kl`` (0.0 without a reference), each a sum over tokens divided by
        ``num_tokens``. The metrics call ``.item()``: one host sync each per call (per micro-batch).
    """
    _check_loss_inputs(logprobs, old_logprobs, advantages, mask, ref_logprobs, kl_coef)
    weights = mask.to(logprobs.dtype)  # (B, T)
    num_tokens = weights.sum().clamp(min=1.0) if num_tokens is None else num_tokens
    ratio = torch.exp(logprobs - old_logprobs.detach())  # (B, T)
    adv = advantages.detach().to(logprobs.dtype).unsqueeze(1)  # (B, 1)
    unclipped = ratio * adv
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps) * adv
    surrogate = torch.minimum(unclipped, clipped)  # (B, T)
    pg_loss = -(surrogate * weights).sum() / num_tokens
    kl = torch.zeros((), dtype=logprobs.dtype, device=logprobs.device)
    if ref_logprobs is not None:
        kl = (kl_k3(logprobs, ref_logprobs.detach()) * weights).sum() / num_tokens
    loss = pg_loss + kl_coef * kl
    with torch.no_grad():
        clip_binds = (clipped < unclipped).to(weights.dtype)
        metrics = {
            "rl/policy_loss": pg_loss.item(),
            "rl/clip_fraction": ((clip_binds * weights).sum() / num_tokens).item(),
            "rl/ratio_mean": ((ratio * weights).sum() / num_tokens).item(),
            "rl/kl": kl.item(),
        }
    return loss, metrics
