"""``policy_logprobs``: the log-probabilities a rollout returns beside its tokens, when a trainer reads them.

The engine samples without keeping each token's log-probability (a speculative step verifies several
tokens at once, under the filtered distribution); a trainer that wants them (TRL's
``off_policy_mask_threshold``) gets them from one teacher-forced forward of the policy, computed as
TRL computes its own: log softmax(logits / temperature), without top-k/top-p.
"""

from __future__ import annotations

import torch

LOGPROB_BATCH = 16  # rows per teacher-forced forward


def policy_logprobs(model, prompt_ids: list[list[int]], completion_ids: list[list[int]], temperature: float,
                    batch_size: int = LOGPROB_BATCH) -> list[list[float]]:
    """log softmax(logits / temperature) of every completion token under ``model``, row by row.

    Rows are right-padded, so every real token keeps its position; no gradient is kept. The logits are
    made only at the completion tokens, a tile at a time (``bebop.rl.grpo.token_logprobs``).

    Example: prompt [1, 4] and completion [8, 9] -> [log p(8 | 1 4), log p(9 | 1 4 8)].
    """
    from bebop.rl.grpo import pad_sequences, token_logprobs

    device = next(model.parameters()).device
    out: list[list[float]] = []
    for start in range(0, len(prompt_ids), batch_size):
        prompts, completions = prompt_ids[start:start + batch_size], completion_ids[start:start + batch_size]
        inputs = (t.to(device) for t in pad_sequences(prompts, completions, pad_id=0))  # 3 x (b, S)
        with torch.no_grad():
            logprobs = token_logprobs(model, *inputs, temperature=temperature)  # (b, S)
        for b, (p, c) in enumerate(zip(prompts, completions)):
            out.append(logprobs[b, len(p):len(p) + len(c)].tolist())  # NOTE: one host sync per row
    return out
