"""The draft loss of a batch of teacher-forced chains, fused with the backbone's lm_head.

``train_mtp`` and the online head update (``bebop.rl.online``) call ``chain_loss``. It gives
``draft_loss`` on ``chain_tensors``'s logits, but from the lm_head's inputs (``chain_states``) through
``draft_loss_from_hidden``, so no (N, K, V) tensor (logits, probabilities or their gradients) exists.

How it differs from ``draft_loss(chain_tensors(...))``:
1) The shared lm_head is read, never trained: its weight is detached (the head's parameters get the
   gradient; the backbone or policy gets none).
2) A backbone whose lm_head the fused loss cannot reproduce falls back to the plain loss on
   ``chain_tensors`` (``fused_loss_blocker`` says why): an lm_head with a bias, or one without a 2-D
   ``weight``. Gemma's final logit soft-capping of the target is applied inside the fused loss.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from bebop.losses import acceptance_stats, draft_loss, draft_loss_from_hidden
from bebop.mtp.data import chain_states, chain_tensors


CHAIN_MEAN_LOSSES = ("e2e_tv",)  # losses that average over chains (mask[:, 0]); the others over (chain, step) entries


def chain_loss_count(loss_name: str, mask: Tensor) -> Tensor:  # () float
    """What ``chain_loss``'s value of ``loss_name`` averages over: the chains, or the valid (chain, step) entries
    of the (N, K) mask. ``loss * count`` is a sum that adds up over batches split in parts.

    Example: mask [[True, True], [True, False]] counts 2 chains for "e2e_tv", 3 entries for "ce".
    """
    return (mask[:, 0] if loss_name in CHAIN_MEAN_LOSSES else mask).sum().float()


def fused_loss_blocker(backbone: nn.Module) -> str:
    """Why the fused loss cannot run on ``backbone``'s lm_head ("" when it can).

    Example: ``fused_loss_blocker(model)`` is "" for every supported family (bias-free lm_heads).
    """
    lm_head = backbone.get_output_embeddings()
    weight = getattr(lm_head, "weight", None)
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        return f"its lm_head ({type(lm_head).__name__}) has no 2-D weight"
    if getattr(lm_head, "bias", None) is not None:
        return "its lm_head adds a bias, which the fused loss does not"
    return ""


def chain_loss(
    backbone: nn.Module,
    head: nn.Module,
    ids: Tensor,  # (B, T)
    lengths: Tensor,  # (B,)
    starts: Tensor,  # (B,)
    k: int,
    chain_context: str,
    loss_name: str,
    temperature: float,
    fused: bool = True,
) -> tuple[Tensor, Tensor, Tensor]:
    """The draft loss of every chain of a padded batch, and the per-entry acceptance probability.

    Args:
        backbone: the HF causal LM the head drafts for; only read.
        head: the ``MtpHead``.
        ids, lengths, starts: the padded batch (``Sequences.batch``).
        k: draft depths per chain (K).
        chain_context: "served" or "unrolled" (``bebop.mtp.chains``).
        loss_name: a key of ``DRAFT_LOSSES``.
        temperature: p and q are softmax(logits / temperature).
        fused: False forces the plain loss on (N, K, V) logits (the reference the fused one equals).

    Returns:
        loss (scalar, with grad through the head), alpha_rs (N, K) = sum_v min(p, q) without grad
        (0 outside the mask on the fused path), mask (N, K) bool.
    """
    if fused and not fused_loss_blocker(backbone):
        draft, target, mask = chain_states(backbone, head, ids, lengths, starts, k, chain_context)
        weight = backbone.get_output_embeddings().weight.detach()  # (V, D)
        softcap = getattr(backbone.config.get_text_config(), "final_logit_softcapping", None)
        loss, alpha_rs = draft_loss_from_hidden(
            loss_name, draft, target, weight, mask, temperature, target_is_hidden=True,
            target_softcap=softcap, with_alpha=True,
        )
        return loss, alpha_rs, mask
    draft, target, mask = chain_tensors(backbone, head, ids, lengths, starts, k, chain_context)
    loss = draft_loss(loss_name, draft, target, mask=mask, temperature=temperature)
    with torch.no_grad():
        alpha_rs, _, _ = acceptance_stats(draft.detach(), target, temperature=temperature)  # (N, K)
    return loss, alpha_rs, mask
