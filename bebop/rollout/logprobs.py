"""Teacher-forced log-probabilities of completions under a policy, with no (rows, T, V) tensor.

    inputs = pad_sequences(prompt_ids, completion_ids, pad_id)       # 3 x (B, T)
    logprobs = token_logprobs(model, *inputs, temperature=T)         # (B, T), with gradient
    rows = policy_logprobs(model, prompt_ids, completion_ids, T)     # lists, no gradient

``token_logprobs`` is what GRPO scores (``bebop.rl``: old, reference and current log-probabilities);
``policy_logprobs`` is what a rollout returns beside its tokens when a trainer reads them. The engine
samples without keeping each token's log-probability (a speculative step verifies several tokens at
once, under the filtered distribution); a trainer that wants them (TRL's ``off_policy_mask_threshold``)
gets them from one teacher-forced forward of the policy, computed as TRL computes its own:
log softmax(logits / temperature), without top-k/top-p.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from bebop.architectures import SUPPORTED_MODEL_TYPES
from bebop.config import temperature_problem
from bebop.losses import token_logprobs_from_hidden
from bebop.mtp.loss import fused_loss_blocker
from bebop.speculative.target import decoder_states

IGNORE_LOGPROB = 0.0  # value of token_logprobs outside the completion, so sums ignore it
LOGPROB_BATCH = 16  # rows per teacher-forced forward


def pad_sequences(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Concatenates prompt + completion per row and right-pads to the longest row.

    Example:
        >>> ids, attn, comp = pad_sequences([[5, 6], [7]], [[8], [9, 3]], pad_id=0)
        >>> ids.tolist(), attn.tolist()
        ([[5, 6, 8], [7, 9, 3]], [[1, 1, 1], [1, 1, 1]])
        >>> comp.tolist()
        [[False, False, True], [False, True, True]]

    Args:
        prompt_ids: token ids of each row's prompt; each must be non-empty, because the first
            completion token is predicted from the last prompt position.
        completion_ids: token ids each row sampled; may be empty.
        pad_id: id written into padded positions (never scored).

    Returns:
        ``input_ids`` (B, T) long, ``attention_mask`` (B, T) long (1 on real tokens, HF
        convention), ``completion_mask`` (B, T) bool (True on completion tokens).
    """
    if len(prompt_ids) != len(completion_ids):
        raise ValueError(f"{len(prompt_ids)} prompts but {len(completion_ids)} completions")
    if not prompt_ids:
        raise ValueError("pad_sequences needs at least one row")
    lengths = [len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)]
    num_rows, max_len = len(prompt_ids), max(lengths)
    input_ids = torch.full((num_rows, max_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((num_rows, max_len), dtype=torch.long)
    completion_mask = torch.zeros((num_rows, max_len), dtype=torch.bool)
    for row, (prompt, completion) in enumerate(zip(prompt_ids, completion_ids)):
        if not prompt:
            raise ValueError(f"row {row} has an empty prompt; nothing predicts its first token")
        n_prompt, n_total = len(prompt), lengths[row]
        input_ids[row, :n_total] = torch.tensor(list(prompt) + list(completion), dtype=torch.long)
        attention_mask[row, :n_total] = 1
        completion_mask[row, n_prompt:n_total] = True
    return input_ids, attention_mask, completion_mask


def lm_head_of(model: nn.Module) -> tuple[torch.Tensor, float | None] | None:
    """(lm_head weight (V, D), final logit soft-cap or None) when ``model``'s logits are exactly
    final_logits(hidden @ weight.T) of its decoder's output, so the tiled lm_head can stand in; else None.

    That holds for every architecture Bebop supports (``bebop.architectures``) whose lm_head has no bias.
    """
    config = model.config.get_text_config()
    if getattr(config, "model_type", "") not in SUPPORTED_MODEL_TYPES or fused_loss_blocker(model):
        return None
    return model.get_output_embeddings().weight, getattr(config, "final_logit_softcapping", None)


def token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,  # (B, T)
    attention_mask: torch.Tensor,  # (B, T)
    completion_mask: torch.Tensor,  # (B, T)
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:  # (B, T), and (B, T) entropies
    """Log-probability of each completion token under a causal LM at the sampling temperature.

    The logits at position t−1 predict token t; they are divided by ``temperature`` so the
    result is the logprob of the distribution the rollout sampled from. Rows may be padded
    anywhere (``pad_sequences`` right-pads): position ids are the running count of real tokens
    (``attention_mask.cumsum − 1``), so a row's real tokens get the same positions, hence the
    same logprobs, alone or in a padded batch. Runs with gradients; wrap it in
    ``torch.no_grad()`` for old or reference logprobs.

    The model's decoder runs once over the batch; the lm_head and log-softmax run only at the
    completion tokens, tiled (``bebop.losses.token_logprobs_from_hidden``), so no (B, T, V) logits
    exist, forward or backward. A model ``lm_head_of`` cannot tile (an lm_head with a bias, an
    unsupported architecture) is scored from its full ``.logits`` instead.

    Args:
        model: a Hugging Face causal LM (called with input_ids, attention_mask, position_ids).
        input_ids: prompt + completion token ids.
        attention_mask: 1 on real tokens, 0 on padding.
        completion_mask: True on the tokens to score (the completion); position 0 is never
            scored because nothing predicts it.
        temperature: the rollout's sampling temperature, > 0.
        with_entropy: also return the entropy of softmax(logits / T) at each scored token's
            position (no gradient).

    Returns:
        float32 logprobs, ``IGNORE_LOGPROB`` (0) wherever ``completion_mask`` is False; with
        ``with_entropy`` also the float32 entropies in nats (0 where the mask is False).
    """
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, T), got shape {tuple(input_ids.shape)}")
    if attention_mask.shape != input_ids.shape or completion_mask.shape != input_ids.shape:
        raise ValueError(
            f"masks must match input_ids {tuple(input_ids.shape)}: attention_mask "
            f"{tuple(attention_mask.shape)}, completion_mask {tuple(completion_mask.shape)}"
        )
    if problem := temperature_problem(temperature, greedy_ok=False):  # NOTE: greedy has no logprobs
        raise ValueError(problem)
    position_ids = (attention_mask.long().cumsum(dim=1) - 1).clamp(min=0)
    inputs = {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
    scored = completion_mask[:, 1:].bool()  # (B, T-1): the position before each scored token
    targets = input_ids[:, 1:][scored]  # (N,)
    lm_head = lm_head_of(model)
    entropy = None
    if lm_head is None:
        logits = model(**inputs, use_cache=False).logits[:, :-1][scored]  # (N, V)
        # Upcast before the softmax: bf16 logsumexp over a large vocabulary loses ~1e-2 nats.
        log_probs = torch.log_softmax(logits.float() / temperature, dim=-1)  # (N, V)
        picked = log_probs.gather(-1, targets[:, None]).squeeze(-1)
        if with_entropy:
            entropy = -(log_probs.exp() * log_probs).sum(-1).detach()
    else:
        weight, softcap = lm_head
        out, _ = decoder_states(model, **inputs, use_cache=False)
        picked = token_logprobs_from_hidden(out.last_hidden_state[:, :-1][scored], weight, targets, temperature,
                                            softcap=softcap, with_entropy=with_entropy)  # (N,)
        if with_entropy:
            picked, entropy = picked
    where = scored.nonzero(as_tuple=True)
    full = [F.pad(torch.full(scored.shape, IGNORE_LOGPROB, device=input_ids.device).index_put(where, x.float()),
                  (1, 0), value=IGNORE_LOGPROB) for x in (picked, entropy) if x is not None]  # (B, T) each
    return (full[0], full[1]) if with_entropy else full[0]


def policy_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float,
                    batch_size: int = LOGPROB_BATCH) -> list[list[float]]:
    """log softmax(logits / temperature) of every completion token under ``model``, row by row.

    Rows are right-padded, so every real token keeps its position; no gradient is kept. The logits are
    made only at the completion tokens, a tile at a time (``token_logprobs``).

    Example: prompt [1, 4] and completion [8, 9] -> [log p(8 | 1 4), log p(9 | 1 4 8)].
    """
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts, completions = prompt_ids[start:start + batch_size], completion_ids[start:start + batch_size]
        inputs = (t.to(device) for t in pad_sequences(prompts, completions, pad_id=0))  # 3 x (b, S)
        with torch.no_grad():
            logprobs = token_logprobs(model, *inputs, temperature=temperature).cpu()  # (b, S), one host sync
        for b, (p, c) in enumerate(zip(prompts, completions)):
            out.append(logprobs[b, len(p):len(p) + len(c)].tolist())
    return out
