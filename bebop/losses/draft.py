"""Draft (MTP head) training objectives compared in arXiv 2606.12370 §2 (shared/paper.md §2).

Terms: the target distribution p = softmax(target_logits / T) is detached (the backbone is frozen
and only the draft learns); the draft distribution is q = softmax(draft_logits / T). Logits are
(N, K, V): N chain start positions, K draft steps; step j of row n is the draft's and the target's
distribution for the same future token. alpha = sum_v min(p_v, q_v) = 1 - d_TV(p, q) is the
rejection-sampling acceptance probability of one step (paper Eq. 2).

Objectives (``DRAFT_LOSSES``):

* ``ce``: soft cross-entropy -sum p log q (gradient q - p, same as fkl);
* ``fkl``: KL(p || q);
* ``rkl``: KL(q || p) (paper Eq. 17);
* ``tv``: d_TV(p, q) = 1 - alpha per step (paper Eq. 10);
* ``e2e_tv``: 1 - (1/K) sum_j prod_{i<=j} alpha_i, one minus the normalised expected accept
  length of a chain (paper Eqs. 12-13).

Where this deviates from the paper's formulas:
1) Averages run over valid entries only: ``mask`` (N, K) marks the (position, step) pairs that
   exist. For ``e2e_tv`` a chain ends at its first False step (later True entries are ignored),
   K_n replaces K in the 1/K normalisation, and chains with K_n = 0 are left out of the mean.
2) A batch with nothing valid gives a loss of 0 (with a zero gradient), not NaN.
3) ``e2e_tv`` differentiates through every factor of the product: earlier alphas are not
   detached (the paper is silent; NVIDIA Megatron's port does the same, shared/paper.md §2.2).
4) The per-step statistics come from `entry_stats`, which never stores an (N, K, V) softmax; see
   its docstring for the numerical conventions (float32 accumulation, the rkl log p floor).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from bebop.losses.entry_stats import VOCAB_CHUNK, check_logits, entry_statistic


def _masked_mean(
    values: Tensor,  # (N, K)
    mask: Tensor,  # (N, K) bool
) -> Tensor:  # ()
    """Mean of values over the True entries of mask; 0 when there are none."""
    total = torch.where(mask, values, 0.0).sum()
    return total / mask.sum().clamp_min(1)


def _chain_prefix(mask: Tensor) -> Tensor:  # (N, K) bool -> (N, K) bool
    """True up to (not including) the first False of each row.

    Example: ``[[True, False, True]] -> [[True, False, False]]``.
    """
    return (~mask).cumsum(dim=1) == 0


def _e2e_tv_from_alpha(
    alpha: Tensor,  # (N, K)
    mask: Tensor,  # (N, K) bool
) -> Tensor:  # ()
    """1 - mean over chains of (1/K_n) sum_{j<K_n} prod_{i<=j} alpha_i.

    Example: alpha = [[0.6, 0.7]] with both steps valid gives 1 - (0.6 + 0.42) / 2 = 0.49.
    """
    prefix = _chain_prefix(mask)  # (N, K)
    num_steps = prefix.sum(dim=1)  # (N,) K_n
    # NOTE: cumprod's backward is exact when some alpha is 0 (no division by alpha).
    chain_accept = torch.where(prefix, alpha, 1.0).cumprod(dim=1)  # (N, K) prod_{i<=j} alpha_i
    accept_length = torch.where(prefix, chain_accept, 0.0).sum(dim=1)  # (N,)
    per_chain = 1.0 - accept_length / num_steps.clamp_min(1)  # (N,)
    return _masked_mean(per_chain, num_steps > 0)


def _tv_from_alpha(
    alpha: Tensor,  # (N, K)
    mask: Tensor,  # (N, K) bool
) -> Tensor:  # ()
    """Mean per-step TV distance 1 - alpha over valid entries. Example: alpha = [[0.6, 0.7]] gives 0.35."""
    return _masked_mean(1.0 - alpha, mask)


# loss name -> (the per-entry statistic of ``entry_statistic``, the reduction of its (N, K) values under the
# (N, K) mask): what a loss is, whether it runs on logits (``DRAFT_LOSSES``) or fused with the lm_head (fused.py)
DRAFT_LOSS_PARTS: dict[str, tuple[str, Callable[[Tensor, Tensor], Tensor]]] = {
    "ce": ("ce", _masked_mean),
    "fkl": ("fkl", _masked_mean),
    "rkl": ("rkl", _masked_mean),
    "tv": ("overlap", _tv_from_alpha),
    "e2e_tv": ("overlap", _e2e_tv_from_alpha),
}


def _loss_of(name: str, doc: str):
    """Draft loss ``name`` on logits: its statistic (``entry_statistic``), then its reduction (``DRAFT_LOSS_PARTS``)."""
    statistic, reduce = DRAFT_LOSS_PARTS[name]

    def loss(
        draft_logits: Tensor,  # (N, K, V)
        target_logits: Tensor,  # (N, K, V)
        mask: Tensor,  # (N, K) bool
        temperature: float,
        *,
        row_chunk: int | None = None,
        vocab_chunk: int = VOCAB_CHUNK,
    ) -> Tensor:  # ()
        value = entry_statistic(
            statistic, draft_logits, target_logits, temperature,
            row_chunk=row_chunk, vocab_chunk=vocab_chunk,
        )
        return reduce(value, mask)

    loss.__name__ = f"{name}_loss"
    loss.__doc__ = doc
    return loss


ce_loss = _loss_of("ce", "Soft cross-entropy -sum_v p log q, averaged over valid entries.")
fkl_loss = _loss_of("fkl", "Forward KL(p || q), averaged over valid entries.")
rkl_loss = _loss_of("rkl", "Reverse KL(q || p), averaged over valid entries.")
tv_loss = _loss_of("tv", "Per-step TV distance 1 - sum_v min(p, q), averaged over valid entries.")
e2e_tv_loss = _loss_of("e2e_tv", """End-to-end TV: one minus the normalised expected accept length (paper Eq. 13).

The gradient reaching step j's logits is the per-step TV gradient scaled by that step's weight in the
chain, -(1/K_n) prod_{i<j} alpha_i (1 + alpha_{j+1} + ...).
""")


# Every value takes validated inputs (a bool (N, K) mask, never None); `draft_loss` validates.
DRAFT_LOSSES: dict[str, Callable[..., Tensor]] = {
    "ce": ce_loss,
    "fkl": fkl_loss,
    "rkl": rkl_loss,
    "tv": tv_loss,
    "e2e_tv": e2e_tv_loss,
}


def _resolve_mask(mask: Tensor | None, draft_logits: Tensor) -> Tensor:  # -> (N, K) bool
    """All-True mask if None, else mask after checking its shape, dtype and device."""
    lead_shape = draft_logits.shape[:2]
    if mask is None:
        return torch.ones(lead_shape, dtype=torch.bool, device=draft_logits.device)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        raise ValueError(f"mask must be a bool tensor, got {getattr(mask, 'dtype', type(mask))}")
    if mask.shape != lead_shape:
        raise ValueError(
            f"mask must have shape (N, K) = {tuple(lead_shape)}, got {tuple(mask.shape)}"
        )
    if mask.device != draft_logits.device:
        raise ValueError(f"mask is on {mask.device} but the logits are on {draft_logits.device}")
    return mask


def draft_loss(
    name: str,
    draft_logits: Tensor,  # (N, K, V)
    target_logits: Tensor,  # (N, K, V)
    mask: Tensor | None = None,  # (N, K) bool
    temperature: float = 1.0,
    *,
    row_chunk: int | None = None,
    vocab_chunk: int = VOCAB_CHUNK,
) -> Tensor:  # ()
    """Draft objective ``name`` on a batch of draft chains; gradients reach draft_logits only.

    Args:
        name: A key of ``DRAFT_LOSSES``: "ce", "fkl", "rkl", "tv" or "e2e_tv".
        draft_logits: Draft logits; q = softmax(draft_logits / temperature).
        target_logits: Target logits; p = softmax(target_logits / temperature), detached.
        mask: True where the (position, step) entry exists; None means all entries do.
        temperature: Softmax temperature T > 0 applied to both distributions.
        row_chunk: Entries per tile of the chunked computation; None fills TILE_ELEMENTS.
        vocab_chunk: Vocabulary columns per tile of the chunked computation.

    Returns:
        The scalar loss, float32 (float64 for float64 inputs).

    Raises:
        ValueError: On an unknown name, mismatched or non-3-D shapes, a non-bool or misshapen
            mask, a non-positive temperature, non-floating dtypes, or NaN/inf logits. The
            NaN/inf check is one host sync per tensor.

    Example:
        >>> z = torch.randn(4, 3, 10, requires_grad=True)
        >>> draft_loss("e2e_tv", z, torch.randn(4, 3, 10)).backward()
    """
    if name not in DRAFT_LOSSES:
        raise ValueError(f"unknown draft loss {name!r}; valid names: {sorted(DRAFT_LOSSES)}")
    check_logits(
        draft_logits, target_logits, temperature, row_chunk=row_chunk, vocab_chunk=vocab_chunk
    )
    mask = _resolve_mask(mask, draft_logits)
    return DRAFT_LOSSES[name](
        draft_logits, target_logits, mask, float(temperature),
        row_chunk=row_chunk, vocab_chunk=vocab_chunk,
    )
