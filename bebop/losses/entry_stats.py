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
the forward keeps its inputs and a few numbers per row (the two logsumexps, S for the overlap),
and the backward recomputes q and p one (row chunk, vocab chunk) tile at a time. Everything is
a plain torch op, so it runs unchanged on CUDA.

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

# NOTE: 256 rows x 65,536 vocab x 4 bytes = 64 MiB per float32 tile buffer; one tile step holds
# about six such buffers, so the working set stays a few hundred MiB whatever N, K and V are.
ROW_CHUNK = 256  # rows (entries) per tile
VOCAB_CHUNK = 65_536  # vocabulary columns per tile
LOG_PROB_FLOOR = -1.0e4  # rkl's lower clamp on log p; only ever reached when t / T overflows

# A statistic's two partial sums over one vocab tile: (value, aux), each (rows,).
PartialSums = Callable[[Tensor, Tensor], "tuple[Tensor, Tensor]"]
# d value / d (z / T) on one vocab tile, given the full-row value and aux.
TileGrad = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class Statistic:
    """How one per-entry statistic sums over vocabulary tiles and how it is differentiated."""

    partial_sums: PartialSums  # (log_q, log_p) tiles (rows, C) -> (value, aux) partial sums (rows,)
    tile_grad: TileGrad  # (log_q, log_p, value, aux) -> d value / d(z / T) on the tile (rows, C)


def _overlap_sums(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial alpha = sum min(p, q) and S = sum q * 1[q <= p] over one tile."""
    q, p = log_q.exp(), log_p.exp()
    return torch.minimum(q, p).sum(-1), torch.where(q <= p, q, 0.0).sum(-1)


def _overlap_grad(log_q: Tensor, log_p: Tensor, value: Tensor, aux: Tensor) -> Tensor:
    """d alpha / dz = -q (S - 1 + 1[q > p]) (paper Eq. 11), with S = aux."""
    q, p = log_q.exp(), log_p.exp()
    # NOTE: q and p are recomputed exactly as in the forward, so 1[q > p] here is the complement
    # of the 1[q <= p] that built S.
    return q * (1.0 - aux[:, None] - (q > p).to(q.dtype))


def _ce_sums(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial -sum p log q over one tile (aux unused)."""
    value = -(log_p.exp() * log_q).sum(-1)
    return value, torch.zeros_like(value)


def _fkl_sums(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial sum p (log p - log q) over one tile (aux unused)."""
    value = (log_p.exp() * (log_p - log_q)).sum(-1)
    return value, torch.zeros_like(value)


def _ce_grad(log_q: Tensor, log_p: Tensor, value: Tensor, aux: Tensor) -> Tensor:
    """d CE / dz = d KL(p || q) / dz = q - p (paper App. B)."""
    return log_q.exp() - log_p.exp()


def _rkl_sums(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    """Partial sum q (log q - log p) over one tile (aux unused)."""
    log_p = log_p.clamp_min(LOG_PROB_FLOOR)
    value = (log_q.exp() * (log_q - log_p)).sum(-1)
    return value, torch.zeros_like(value)


def _rkl_grad(log_q: Tensor, log_p: Tensor, value: Tensor, aux: Tensor) -> Tensor:
    """d KL(q || p) / dz = q (log q - log p - KL(q || p)) (paper Eq. 17), with KL = value."""
    log_p = log_p.clamp_min(LOG_PROB_FLOOR)
    return log_q.exp() * (log_q - log_p - value[:, None])


STATISTICS = {
    "overlap": Statistic(_overlap_sums, _overlap_grad),
    "ce": Statistic(_ce_sums, _ce_grad),
    "fkl": Statistic(_fkl_sums, _ce_grad),
    "rkl": Statistic(_rkl_sums, _rkl_grad),
}


def compute_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """Dtype the statistics accumulate in: at least float32, float64 if any input is.

    Example: ``compute_dtype(torch.bfloat16, torch.float32) == torch.float32``.
    """
    out = torch.float32
    for dtype in dtypes:
        out = torch.promote_types(out, dtype)
    return out


def check_logits(
    draft_logits: Tensor,  # (N, K, V)
    target_logits: Tensor,  # (N, K, V)
    temperature: float,
    *,
    row_chunk: int,
    vocab_chunk: int,
) -> None:
    """Raises ValueError unless the logits pair, temperature and chunk sizes are usable.

    Costs one host sync per tensor (the finiteness check), chunked over rows so it never
    allocates an (N, K, V) mask.
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
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        raise ValueError(f"temperature must be a number, got {type(temperature).__name__}")
    if not 0.0 < temperature < float("inf"):
        raise ValueError(f"temperature must be finite and > 0, got {temperature}")
    if row_chunk < 1 or vocab_chunk < 1:
        raise ValueError(f"row_chunk and vocab_chunk must be >= 1, got {row_chunk}, {vocab_chunk}")
    for label, x in (("draft_logits", draft_logits), ("target_logits", target_logits)):
        rows = x.reshape(-1, x.shape[-1])
        tiles = [torch.isfinite(rows[r]).all() for r in _row_slices(rows.shape[0], row_chunk)]
        if tiles and not bool(torch.stack(tiles).all()):  # host sync, once per tensor
            raise ValueError(f"{label} contains NaN or inf")


def _row_slices(num_rows: int, row_chunk: int) -> Iterator[slice]:
    """Consecutive row slices of at most row_chunk rows."""
    for start in range(0, num_rows, row_chunk):
        yield slice(start, min(start + row_chunk, num_rows))


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


def _log_prob_tiles(
    draft_logits: Tensor,  # (R, V)
    target_logits: Tensor,  # (R, V)
    log_norm_q: Tensor,  # (R,)
    log_norm_p: Tensor,  # (R,)
    temperature: float,
    vocab_chunk: int,
    dtype: torch.dtype,
) -> Iterator[tuple[slice, Tensor, Tensor]]:
    """Yields (columns, log q tile (R, C), log p tile (R, C)) across the vocabulary."""
    for v in range(0, draft_logits.shape[-1], vocab_chunk):
        cols = slice(v, v + vocab_chunk)
        log_q = draft_logits[:, cols].to(dtype) / temperature - log_norm_q[:, None]
        log_p = target_logits[:, cols].to(dtype) / temperature - log_norm_p[:, None]
        yield cols, log_q, log_p


class _EntryStatisticFunction(torch.autograd.Function):
    """(R, V) draft and target logits -> (R,) statistic; analytic, tiled backward."""

    @staticmethod
    def forward(ctx, draft, target, statistic, temperature, row_chunk, vocab_chunk):
        dtype = compute_dtype(draft.dtype, target.dtype)
        num_rows = draft.shape[0]
        value, aux, log_norm_q, log_norm_p = (
            draft.new_empty(num_rows, dtype=dtype) for _ in range(4)
        )
        for rows in _row_slices(num_rows, row_chunk):
            log_norm_q[rows] = _row_logsumexp(draft[rows], temperature, vocab_chunk, dtype)
            log_norm_p[rows] = _row_logsumexp(target[rows], temperature, vocab_chunk, dtype)
            value_sum, aux_sum = 0.0, 0.0
            for _, log_q, log_p in _log_prob_tiles(
                draft[rows], target[rows], log_norm_q[rows], log_norm_p[rows],
                temperature, vocab_chunk, dtype,
            ):
                tile_value, tile_aux = statistic.partial_sums(log_q, log_p)
                value_sum, aux_sum = value_sum + tile_value, aux_sum + tile_aux
            value[rows], aux[rows] = value_sum, aux_sum
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
            for cols, log_q, log_p in _log_prob_tiles(
                draft[rows], target[rows], log_norm_q[rows], log_norm_p[rows],
                temperature, vocab_chunk, dtype,
            ):
                tile = statistic.tile_grad(log_q, log_p, value[rows], aux[rows])
                grad_draft[rows, cols] = (scale[rows, None] * tile).to(grad_draft.dtype)
        return grad_draft, None, None, None, None, None


def entry_statistic(
    name: str,
    draft_logits: Tensor,  # (..., V)
    target_logits: Tensor,  # (..., V)
    temperature: float = 1.0,
    *,
    row_chunk: int = ROW_CHUNK,
    vocab_chunk: int = VOCAB_CHUNK,
) -> Tensor:  # (...)
    """One statistic of (p, q) per entry, differentiable w.r.t. draft_logits only.

    Inputs are not validated here (see `check_logits`); the target never receives a gradient.

    Args:
        name: One of ``STATISTICS``: "overlap", "ce", "fkl" or "rkl".
        draft_logits: Draft logits z; q = softmax(z / temperature).
        target_logits: Target logits t; p = softmax(t / temperature), treated as a constant.
        temperature: Softmax temperature T > 0 applied to both sides.
        row_chunk: Entries per tile.
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
        row_chunk,
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


@torch.no_grad()
def acceptance_stats(
    draft_logits: Tensor,  # (N, K, V)
    target_logits: Tensor,  # (N, K, V)
    temperature: float = 1.0,
    *,
    row_chunk: int = ROW_CHUNK,
    vocab_chunk: int = VOCAB_CHUNK,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-entry acceptance probabilities and target entropy, without gradient.

    Args:
        draft_logits: Draft logits z; q = softmax(z / temperature).
        target_logits: Target logits t; p = softmax(t / temperature).
        temperature: Softmax temperature T > 0 applied to both sides.
        row_chunk: Entries per tile.
        vocab_chunk: Vocabulary columns per tile.

    Returns:
        ``(alpha_rs, alpha_to, target_entropy)``, each (N, K) float32 (float64 for float64
        inputs): alpha_rs = sum_v min(p, q) (rejection sampling, paper Eq. 2), alpha_to =
        p(argmax q) (target-only sampling, paper Eq. 1), target_entropy = H(p) in nats.

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
    alpha_rs, alpha_to, entropy = (draft.new_empty(draft.shape[0], dtype=dtype) for _ in range(3))
    for rows in _row_slices(draft.shape[0], row_chunk):
        log_norm_q = _row_logsumexp(draft[rows], temperature, vocab_chunk, dtype)
        log_norm_p = _row_logsumexp(target[rows], temperature, vocab_chunk, dtype)
        overlap, neg_entropy = 0.0, 0.0
        for _, log_q, log_p in _log_prob_tiles(
            draft[rows], target[rows], log_norm_q, log_norm_p, temperature, vocab_chunk, dtype
        ):
            p = log_p.exp()
            overlap = overlap + torch.minimum(p, log_q.exp()).sum(-1)
            neg_entropy = neg_entropy + (p * log_p).sum(-1)
        # The temperature does not move the argmax, so the raw draft logits suffice.
        greedy = _tile_argmax(draft[rows], vocab_chunk)  # (rows,)
        greedy_logit = target[rows].gather(-1, greedy[:, None]).squeeze(-1).to(dtype)
        alpha_rs[rows] = overlap
        alpha_to[rows] = (greedy_logit / temperature - log_norm_p).exp()
        entropy[rows] = -neg_entropy
    return alpha_rs.reshape(lead_shape), alpha_to.reshape(lead_shape), entropy.reshape(lead_shape)
