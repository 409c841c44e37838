"""Draft (MTP head) training objectives: ce, fkl, rkl, tv and e2e_tv (arXiv 2606.12370 §2).

    loss = draft_loss("e2e_tv", draft_logits, target_logits, mask)  # (N, K, V), (N, K, V), (N, K)
    alpha_rs, alpha_to, target_entropy = acceptance_stats(draft_logits, target_logits)

Modules:
    draft.py        the objectives, the ``DRAFT_LOSSES`` registry and ``draft_loss``
    entry_stats.py  per-entry statistics (alpha, ce, KL) tiled over rows and vocabulary,
                    with analytic backward; ``acceptance_stats`` for evaluation
"""

from bebop.losses.draft import DRAFT_LOSSES, draft_loss
from bebop.losses.entry_stats import (
    LOG_PROB_FLOOR,
    TILE_ELEMENTS,
    VOCAB_CHUNK,
    acceptance_stats,
)

__all__ = [
    "DRAFT_LOSSES",
    "LOG_PROB_FLOOR",
    "TILE_ELEMENTS",
    "VOCAB_CHUNK",
    "acceptance_stats",
    "draft_loss",
]
