"""Per-entry statistics of a target p and a draft q, computed tile by tile over rows and vocabulary.

Terms (shared/paper.md §2, arXiv 2606.12370): p = softmax(target_logits / T) is the target's
distribution and is never differentiated; q = softmax(draft_logits / T) is the draft's. An *entry*
is one (position, draft step) pair, i.e. one row of the flattened (N*K, V) logits. For each entry
this module computes one number:

* ``overlap``: alpha = sum_v min(p_v, q_v), the rejection-sampling acceptance probability
  (paper Eq. 2), alpha = 1 - d_TV(p, q);
* ``ce``: -sum_v p_v log q_v (soft cross-entropy);
* ``fkl``: sum_v p_v (log p_v - log q_v) = KL(p || q);
* ``rkl``: sum_v q_v (log q_v - log p_v) = KL(q || p).

`entry_statistic` differentiates it with a custom autograd Function whose backward is the
analytic gradient (paper Eq. 11, App. A-C), so no (N*K, V) softmax is ever stored (paper App. F):
the forward keeps its inputs and a few numbers per row (the statistic, S for the overlap, the
row logsumexps of both sides), and the backward recomputes q and p one (row chunk, vocab chunk)
tile at a time. The overlap (the hot path: tv, e2e_tv) skips the logsumexp pass when a tile spans
whole rows (the default up to VOCAB_CHUNK columns) and uses the fused softmax kernel instead.
Everything is a plain torch op, so it runs unchanged on CUDA.

Where this deviates from the textbook formulas:
1) In ``rkl`` log p is clamped below at LOG_PROB_FLOOR. log p comes from a log-softmax, so it is
   finite for finite logits and the clamp never fires in practice; it only keeps KL(q || p) and its
   gradient finite if t / T overflows to -inf (huge logits at a tiny temperature).
2) The overlap's subgradient at a tie q_v == p_v is 1[q_v <= p_v] (paper App. A); tokens where
   both probabilities underflow to 0 count as "q <= p" but carry no mass, so nothing changes.
3) bfloat16 / float16 logits are upcast tile by tile and every sum accumulates in float32
   (float64 inputs stay float64); the gradient is cast back to the draft logits' dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from torch import Tensor

from bebop.config import temperature_problem
from bebop.utils.torch_utils import compute_dtype

# NOTE: a tile is (row chunk, vocab chunk); one tile step holds about six float32 buffers of that
# size. 2**22 elements = 16 MiB each: big enough to keep a GPU busy, and small enough that glibc
# reuses freed tiles on CPU instead of mapping (and page-faulting) fresh memory for every tile.
TILE_ELEMENTS = 2**22  # default row chunk = TILE_ELEMENTS // vocab columns per tile
VOCAB_CHUNK = 262_144  # whole rows up to 256k vocabularies (Qwen's 151,936 included)
LOG_PROB_FLOOR = -1.0e4  # rkl's lower clamp on log p; only ever reached when t / T overflows

# NOTE: the functions below receive freshly computed tiles (rows, C) of q and p, or of log q and
# log p when the statistic is `in_log_space`; nobody else holds them, so they may be overwritten
# in place to save memory traffic.


@dataclass(frozen=True)
class Statistic:
    """How one per-entry statistic sums over vocabulary tiles and how it is differentiated."""

    in_log_space: bool  # tiles hold (log q, log p) rather than (q, p)
    # (q, p) or (log q, log p) tiles (rows, C) -> (value, aux) partial sums, each (rows,)
    partial_sums: Callable[[Tensor, Tensor], "tuple[Tensor, Tensor]"]
    # (tile_q, tile_p, value, aux, scale) -> scale * d value / d(z / T) on the tile (rows, C),
    # given the full-row value and aux (rows,) and the upstream gradient scale (rows,)
    tile_grad: Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def _overlap_sums(q: Tensor, p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial alpha = sum min(p, q) and S = sum q * 1[q <= p] over one tile."""
    below = (q <= p).to(q.dtype)
    return torch.minimum(q, p).sum(-1), below.mul_(q).sum(-1)


def _overlap_grad(q: Tensor, p: Tensor, value: Tensor, aux: Tensor, scale: Tensor) -> Tensor:
    """scale * d alpha / dz with d alpha / dz = -q (S - 1 + 1[q > p]) (paper Eq. 11), S = aux."""
    # NOTE: q and p are recomputed exactly as in the forward, so 1[q > p] here is the complement
    # of the 1[q <= p] that built S.
    above = -scale[:, None] * aux[:, None]  # (rows, 1)
    below = scale[:, None] * (1.0 - aux[:, None])  # (rows, 1)
    return torch.where(q > p, above, below).mul_(q)


def _ce_sums(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial -sum p log q over one tile (aux unused)."""
    value = -log_p.exp_().mul_(log_q).sum(-1)
    return value, torch.zeros_like(value)


def _fkl_sums(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial sum p (log p - log q) over one tile (aux unused)."""
    log_ratio = log_p - log_q
    value = log_p.exp_().mul_(log_ratio).sum(-1)
    return value, torch.zeros_like(value)


def _ce_grad(log_q: Tensor, log_p: Tensor, value: Tensor, aux: Tensor, scale: Tensor) -> Tensor:
    """scale * d CE / dz, where d CE / dz = d KL(p || q) / dz = q - p (paper App. B)."""
    return log_q.exp_().sub_(log_p.exp_()).mul_(scale[:, None])


def _rkl_sums(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial sum q (log q - log p) over one tile (aux unused)."""
    log_ratio = log_p.clamp_min_(LOG_PROB_FLOOR).neg_().add_(log_q)  # log q - log p
    value = log_q.exp_().mul_(log_ratio).sum(-1)
    return value, torch.zeros_like(value)


def _rkl_grad(log_q: Tensor, log_p: Tensor, value: Tensor, aux: Tensor, scale: Tensor) -> Tensor:
    """scale * d KL(q || p) / dz = scale * q (log q - log p - KL) (paper Eq. 17), KL = value."""
    centred = log_p.clamp_min_(LOG_PROB_FLOOR).neg_().add_(log_q).sub_(value[:, None])
    return centred.mul_(log_q.exp_()).mul_(scale[:, None])


STATISTICS = {
    "overlap": Statistic(False, _overlap_sums, _overlap_grad),
    "ce": Statistic(True, _ce_sums, _ce_grad),
    "fkl": Statistic(True, _fkl_sums, _ce_grad),
    "rkl": Statistic(True, _rkl_sums, _rkl_grad),
}


def resolve_row_chunk(row_chunk: int | None, vocab: int, vocab_chunk: int) -> int:
    """row_chunk, or by default as many rows as fit TILE_ELEMENTS.

    Example: ``resolve_row_chunk(None, 151_936, VOCAB_CHUNK) == 27``.
    """
    if row_chunk is not None:
        return row_chunk
    return max(1, TILE_ELEMENTS // max(1, min(vocab, vocab_chunk)))


def check_logits(
    draft_logits: Tensor,  # (N, K, V)
    target_logits: Tensor,  # (N, K, V)
    temperature: float,
    *,
    row_chunk: int | None,
    vocab_chunk: int,
) -> None:
    """Raises ValueError unless the logits pair, temperature and chunk sizes are usable.

    Costs one host sync per tensor (the NaN/inf check, a min/max reduction).
    """
    for label, x in (("draft_logits", draft_logits), ("target_logits", target_logits)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{label} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3:
            raise ValueError(f"{label} must be 3-D (N, K, V), got shape {tuple(x.shape)}")
        if not x.is_floating_point():
            raise ValueError(f"{label} must be a floating dtype, got {x.dtype}")
    if draft_logits.shape != target_logits.shape:
        raise ValueError(
            f"draft_logits {tuple(draft_logits.shape)} and target_logits "
            f"{tuple(target_logits.shape)} must have the same (N, K, V) shape"
        )
    if draft_logits.device != target_logits.device:
        raise ValueError(
            f"draft_logits on {draft_logits.device} and target_logits on "
            f"{target_logits.device} must be on the same device"
        )
    if problem := temperature_problem(temperature, greedy_ok=False):
        raise ValueError(problem)
    if (row_chunk is not None and row_chunk < 1) or vocab_chunk < 1:
        raise ValueError(f"row_chunk and vocab_chunk must be >= 1, got {row_chunk}, {vocab_chunk}")
    for label, x in (("draft_logits", draft_logits), ("target_logits", target_logits)):
        # min and max propagate NaN, so one reduction pass (no (N, K, V) mask) sees NaN and inf.
        if x.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):  # sync
            raise ValueError(f"{label} contains NaN or inf")


def _row_slices(num_rows: int, row_chunk: int) -> Iterator[slice]:
    """Consecutive row slices of at most row_chunk rows."""
    for start in range(0, num_rows, row_chunk):
        yield slice(start, min(start + row_chunk, num_rows))


def _take(x: Tensor | None, rows: slice) -> Tensor | None:
    """x[rows], passing None through."""
    return None if x is None else x[rows]


def _row_logsumexp(
    logits: Tensor,  # (R, V)
    temperature: float,
    vocab_chunk: int,
    dtype: torch.dtype,
) -> Tensor:  # (R,)
    """logsumexp(logits / T) over the vocabulary, one vocab tile at a time."""
    parts = [
        torch.logsumexp(logits[:, v : v + vocab_chunk].to(dtype) / temperature, dim=-1)
        for v in range(0, logits.shape[-1], vocab_chunk)
    ]
    return torch.logsumexp(torch.stack(parts, dim=-1), dim=-1)


def _prob_tile(
    logits: Tensor,  # (R, C)
    log_norm: Tensor | None,  # (R,)
    temperature: float,
    dtype: torch.dtype,
    log: bool,
) -> Tensor:  # (R, C), a fresh tensor
    """softmax(logits / T), or its log if log, on one tile.

    log_norm (the row logsumexp of logits / T) may be None only for whole-row tiles and log=False.
    """
    scaled = logits.to(dtype)
    if temperature != 1.0:
        scaled = scaled / temperature
    if log_norm is None:
        # NOTE: the fused CPU softmax sums its normaliser sequentially (relative error ~2e-5 at
        # V = 152k); renormalising with torch.sum's cascade sum restores float32 accuracy.
        probs = torch.softmax(scaled, dim=-1)
        return probs.div_(probs.sum(dim=-1, keepdim=True))
    log_probs = scaled - log_norm[:, None]
    return log_probs if log else log_probs.exp_()


def _prob_tiles(
    draft_logits: Tensor,  # (R, V)
    target_logits: Tensor,  # (R, V)
    log_norm_q: Tensor | None,  # (R,); None allowed as in _prob_tile
    log_norm_p: Tensor | None,  # (R,)
    temperature: float,
    vocab_chunk: int,
    dtype: torch.dtype,
    log: bool,
) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """Yields (columns, q tile (R, C), p tile (R, C)) across the vocabulary (logs if log)."""
    for v in range(0, draft_logits.shape[-1], vocab_chunk):
        cols = slice(v, v + vocab_chunk)
        q = _prob_tile(draft_logits[:, cols], log_norm_q, temperature, dtype, log)
        p = _prob_tile(target_logits[:, cols], log_norm_p, temperature, dtype, log)
        yield cols, q, p


def _needs_log_norms(vocab: int, vocab_chunk: int, log: bool) -> bool:
    """Whether tiles need precomputed row logsumexps: for log-probs or a split vocabulary."""
    return log or vocab > vocab_chunk


class _EntryStatisticFunction(torch.autograd.Function):
    """(R, V) draft and target logits -> (R,) statistic; analytic, tiled backward."""

    @staticmethod
    def forward(ctx, draft, target, statistic, temperature, row_chunk, vocab_chunk):
        dtype = compute_dtype(draft.dtype, target.dtype)
        num_rows, vocab = draft.shape
        value, aux = (draft.new_empty(num_rows, dtype=dtype) for _ in range(2))
        log_norm_q = log_norm_p = None
        if _needs_log_norms(vocab, vocab_chunk, statistic.in_log_space):
            log_norm_q, log_norm_p = (draft.new_empty(num_rows, dtype=dtype) for _ in range(2))
        for rows in _row_slices(num_rows, row_chunk):
            if log_norm_q is not None:
                log_norm_q[rows] = _row_logsumexp(draft[rows], temperature, vocab_chunk, dtype)
                log_norm_p[rows] = _row_logsumexp(target[rows], temperature, vocab_chunk, dtype)
            sums = [
                torch.stack(statistic.partial_sums(tile_q, tile_p))  # (2, rows)
                for _, tile_q, tile_p in _prob_tiles(
                    draft[rows], target[rows], _take(log_norm_q, rows), _take(log_norm_p, rows),
                    temperature, vocab_chunk, dtype, statistic.in_log_space,
                )
            ]
            value[rows], aux[rows] = torch.stack(sums).sum(0)
        ctx.save_for_backward(draft, target, log_norm_q, log_norm_p, value, aux)
        ctx.config = (statistic, temperature, row_chunk, vocab_chunk, dtype)
        return value

    @staticmethod
    def backward(ctx, grad_value):  # grad_value (R,)
        if not ctx.needs_input_grad[0]:
            return None, None, None, None, None, None
        draft, target, log_norm_q, log_norm_p, value, aux = ctx.saved_tensors
        statistic, temperature, row_chunk, vocab_chunk, dtype = ctx.config
        # d/dz = (d/du) / T with u = z / T.
        scale = grad_value.to(dtype) / temperature  # (R,)
        grad_draft = torch.empty_like(draft)  # (R, V)
        for rows in _row_slices(draft.shape[0], row_chunk):
            for cols, tile_q, tile_p in _prob_tiles(
                draft[rows], target[rows], _take(log_norm_q, rows), _take(log_norm_p, rows),
                temperature, vocab_chunk, dtype, statistic.in_log_space,
            ):
                grad_draft[rows, cols] = statistic.tile_grad(
                    tile_q, tile_p, value[rows], aux[rows], scale[rows]
                )
        return grad_draft, None, None, None, None, None


def entry_statistic(
    name: str,
    draft_logits: Tensor,  # (..., V)
    target_logits: Tensor,  # (..., V)
    temperature: float = 1.0,
    *,
    row_chunk: int | None = None,
    vocab_chunk: int = VOCAB_CHUNK,
) -> Tensor:  # (...)
    """One statistic of (p, q) per entry, differentiable w.r.t. draft_logits only.

    Inputs are not validated here (see `check_logits`); the target never receives a gradient.

    Args:
        name: One of ``STATISTICS``: "overlap", "ce", "fkl" or "rkl".
        draft_logits: Draft logits z; q = softmax(z / temperature).
        target_logits: Target logits t; p = softmax(t / temperature), treated as a constant.
        temperature: Softmax temperature T > 0 applied to both sides.
        row_chunk: Entries per tile; None fills TILE_ELEMENTS.
        vocab_chunk: Vocabulary columns per tile.

    Returns:
        The statistic per entry, shape ``draft_logits.shape[:-1]``, in float32 (float64 for
        float64 inputs).

    Example:
        With p = q, ``entry_statistic("overlap", z, z)`` is all ones and ``"rkl"`` all zeros.
    """
    statistic = STATISTICS[name]
    lead_shape, vocab = draft_logits.shape[:-1], draft_logits.shape[-1]
    value = _EntryStatisticFunction.apply(
        draft_logits.reshape(-1, vocab),
        target_logits.detach().reshape(-1, vocab),
        statistic,
        float(temperature),
        resolve_row_chunk(row_chunk, vocab, vocab_chunk),
        vocab_chunk,
    )
    return value.reshape(lead_shape)


def _tile_argmax(logits: Tensor, vocab_chunk: int) -> Tensor:  # (R, V) -> (R,) int64
    """First index of the row maximum, one vocab tile at a time (matches torch.argmax)."""
    best_value = best_index = None
    for v in range(0, logits.shape[-1], vocab_chunk):
        tile_value, tile_index = logits[:, v : v + vocab_chunk].max(dim=-1)
        tile_index = tile_index + v
        if best_value is None:
            best_value, best_index = tile_value, tile_index
        else:
            # Strict '>' keeps the earliest tile on ties, like torch.argmax.
            better = tile_value > best_value
            best_value = torch.where(better, tile_value, best_value)
            best_index = torch.where(better, tile_index, best_index)
    return best_index


def _acceptance_rows(
    draft: Tensor,  # (R, V)
    target: Tensor,  # (R, V)
    temperature: float,
    vocab_chunk: int,
    dtype: torch.dtype,
) -> Tensor:  # (3, R): alpha_rs, alpha_to, target_entropy
    """`acceptance_stats` for one row chunk."""
    log_norm_q = _row_logsumexp(draft, temperature, vocab_chunk, dtype)
    log_norm_p = _row_logsumexp(target, temperature, vocab_chunk, dtype)
    # The temperature does not move the argmax, so the raw draft logits suffice.
    greedy = _tile_argmax(draft, vocab_chunk)  # (R,)
    overlap = neg_entropy = log_p_greedy = 0.0
    for cols, log_q, log_p in _prob_tiles(
        draft, target, log_norm_q, log_norm_p, temperature, vocab_chunk, dtype, log=True
    ):
        inside = (greedy >= cols.start) & (greedy < cols.start + log_p.shape[-1])  # (R,)
        local = (greedy - cols.start).clamp(0, log_p.shape[-1] - 1)[:, None]  # (R, 1)
        log_p_greedy = torch.where(inside, log_p.gather(-1, local).squeeze(-1), log_p_greedy)
        p = log_p.exp()
        neg_entropy = neg_entropy + (p * log_p).sum(-1)
        overlap = overlap + torch.minimum(p, log_q.exp_()).sum(-1)
    return torch.stack([overlap, log_p_greedy.exp(), -neg_entropy])


@torch.no_grad()
def acceptance_stats(
    draft_logits: Tensor,  # (N, K, V)
    target_logits: Tensor,  # (N, K, V)
    temperature: float = 1.0,
    *,
    row_chunk: int | None = None,
    vocab_chunk: int = VOCAB_CHUNK,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-entry acceptance probabilities and target entropy, without gradient.

    Args:
        draft_logits: Draft logits z; q = softmax(z / temperature).
        target_logits: Target logits t; p = softmax(t / temperature).
        temperature: Softmax temperature T > 0 applied to both sides.
        row_chunk: Entries per tile; None fills TILE_ELEMENTS.
        vocab_chunk: Vocabulary columns per tile.

    Returns:
        ``(alpha_rs, alpha_to, target_entropy)``, each (N, K) float32 (float64 for float64
        inputs): alpha_rs = sum_v min(p, q) (rejection sampling, paper Eq. 2), alpha_to =
        p(argmax q) (target-only sampling, paper Eq. 1; ties go to the first index),
        target_entropy = H(p) in nats.

    Raises:
        ValueError: On malformed inputs (see `check_logits`).

    Example:
        p = [0.5, 0.3, 0.2] and q = [0.2, 0.2, 0.6] give alpha_rs = 0.6, alpha_to = 0.2 and
        target_entropy = 1.0297.
    """
    check_logits(
        draft_logits, target_logits, temperature, row_chunk=row_chunk, vocab_chunk=vocab_chunk
    )
    lead_shape, vocab = draft_logits.shape[:-1], draft_logits.shape[-1]
    draft, target = draft_logits.reshape(-1, vocab), target_logits.reshape(-1, vocab)
    dtype = compute_dtype(draft.dtype, target.dtype)
    stats = draft.new_empty((3, draft.shape[0]), dtype=dtype)
    for rows in _row_slices(draft.shape[0], resolve_row_chunk(row_chunk, vocab, vocab_chunk)):
        stats[:, rows] = _acceptance_rows(
            draft[rows], target[rows], float(temperature), vocab_chunk, dtype
        )
    alpha_rs, alpha_to, target_entropy = stats.reshape(3, *lead_shape).unbind(0)
    return alpha_rs, alpha_to, target_entropy
