"""Draft (MTP head) training objectives: ce, fkl, rkl, tv and e2e_tv (arXiv 2606.12370 §2).

    loss = draft_loss("e2e_tv", draft_logits, target_logits, mask)  # (N, K, V), (N, K, V), (N, K)
    loss = draft_loss_from_hidden("e2e_tv", draft_hidden, target_hidden, lm_head.weight, mask)  # (N, K, D)
    alpha_rs, alpha_to, target_entropy = acceptance_stats(draft_logits, target_logits)

Modules:
    draft.py        the objectives, the ``DRAFT_LOSSES`` registry and ``draft_loss``
    entry_stats.py  per-entry statistics (alpha, ce, KL) tiled over rows and vocabulary,
                    with analytic backward; ``acceptance_stats`` for evaluation
    fused.py        the same objectives fused with the lm_head: ``draft_loss_from_hidden``
                    takes hidden states and the weight, never holds (N, K, V)
    logprobs.py     a policy's token log-probabilities through the same tiled lm_head:
                    ``token_logprobs_from_hidden`` (GRPO's logprobs, never (tokens, V))
"""

from bebop.losses.draft import DRAFT_LOSSES, draft_loss
from bebop.losses.entry_stats import (
    LOG_PROB_FLOOR,
    TILE_ELEMENTS,
    VOCAB_CHUNK,
    acceptance_stats,
)
from bebop.losses.fused import draft_loss_from_hidden
from bebop.losses.logprobs import token_logprobs_from_hidden

__all__ = [
    "DRAFT_LOSSES",
    "LOG_PROB_FLOOR",
    "TILE_ELEMENTS",
    "VOCAB_CHUNK",
    "acceptance_stats",
    "draft_loss",
    "draft_loss_from_hidden",
    "token_logprobs_from_hidden",
]
