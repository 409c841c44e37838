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

    Rows are right-padded, so every real token keeps its position; no gradient is kept.

    Example: prompt [1, 4] and completion [8, 9] -> [log p(8 | 1 4), log p(9 | 1 4 8)].
    """
    device = next(model.parameters()).device
    out: list[list[float]] = []
    for start in range(0, len(prompt_ids), batch_size):
        seqs = [p + c for p, c in zip(prompt_ids[start:start + batch_size], completion_ids[start:start + batch_size])]
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long, device=device)  # (b, S)
        mask = torch.zeros_like(ids)  # (b, S)
        for b, s in enumerate(seqs):
            ids[b, :len(s)] = torch.tensor(s, device=device)
            mask[b, :len(s)] = 1
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask).logits  # (b, S, V)
        for b, p in enumerate(prompt_ids[start:start + batch_size]):
            n = len(completion_ids[start + b])
            rows = logits[b, len(p) - 1:len(p) - 1 + n].float() / temperature  # (n, V)
            logp = torch.log_softmax(rows, dim=-1).gather(-1, ids[b, len(p):len(p) + n, None])[:, 0]
            out.append(logp.tolist())  # NOTE: one host sync per row
    return out
