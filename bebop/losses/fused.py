"""Draft losses fused with the lm_head: logits made tile by tile from hidden states, never (N, K, V).

    loss = draft_loss_from_hidden("e2e_tv", draft_hidden, target_hidden, lm_head.weight, mask)

The draft's logits are z = draft_hidden @ weight.T, the target's t = target_hidden @ weight.T (or
given directly as logits); every objective of ``DRAFT_LOSSES`` is then exactly `draft_loss` on
(z, t): same terms, same mask semantics, same float32 accumulation (see bebop/losses/draft.py and
entry_stats.py). What changes is what is held in memory (the paper's App. F memory argument,
carried through the lm_head):

* a *row chunk* of entries computes its (rows, V) logits with one matmul into a buffer every chunk
  reuses (a hidden target's rows join the draft's, so the weight is read once per chunk);
* the statistics walk the chunk in small tiles (``entry_stats.TILE_ELEMENTS``: whole rows, then
  ``vocab_chunk`` columns at a time) with the statistic functions of `entry_stats`; as soon as a
  tile's rows are summed, their analytic gradient g = d statistic / dz overwrites their draft
  logits, and one (rows, V) @ (V, D) matmul gives d statistic / d hidden = (g / T) @ weight, kept
  (rows, D). The loss's backward only scales these rows by the upstream gradient, because each
  statistic depends on its own row's hidden state alone: no logits are recomputed for the hidden
  states' gradient;
* a trainable weight (``weight.requires_grad``) gets its gradient in the backward, which
  recomputes each row chunk's logits and gradient once: sum over rows of scale_r g_r^T hidden_r (V, D).

The row chunk is the speed/memory trade-off: each chunk reads the whole (V, D) weight, so wider
chunks run the matmuls faster, and the working set is one chunk's logits (see FUSED_TILE_ELEMENTS).

Where this deviates from `draft_loss`:
1) Entries outside ``mask`` are never computed (they carry no loss and no gradient there either);
   ``with_alpha``'s alpha is 0 on them.
2) Logits are computed in the inputs' dtype (bfloat16 inputs give the bfloat16 logits the model's
   own lm_head gives), then upcast: statistics accumulate in float32, float64 for float64 inputs.
   d statistic / dz meets the weight in the inputs' dtype, as autograd through the lm_head would:
   the hidden states' gradient is one matmul per row chunk in that dtype, the weight's is summed
   over chunks in the accumulation dtype; both are cast to the inputs' dtype at the end.
3) Inputs are checked here and refused with `BebopError` (one line), not ValueError.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from bebop.config import temperature_problem
from bebop.losses.draft import DRAFT_LOSS_PARTS, DRAFT_LOSSES, _resolve_mask
from bebop.losses.entry_stats import (
    STATISTICS,
    VOCAB_CHUNK,
    Statistic,
    _needs_log_norms,
    _prob_tiles,
    _row_logsumexp,
    _row_slices,
    resolve_row_chunk,
)
from bebop.utils.errors import BebopError
from bebop.utils.torch_utils import compute_dtype

# NOTE: a row chunk's matmul writes draft and target logits into one (2 * rows, V) buffer that every
# chunk reuses (a fresh one per chunk would page-fault every time and briefly hold two), its
# statistics walk it in entry_stats' small tiles (TILE_ELEMENTS), and the gradient overwrites the
# draft half, so the working set is that buffer plus a few tiles. Each chunk reads the whole
# (V, D) weight, so the chunk sets the matmuls' width: wider chunks run the matmul faster, narrower
# ones hold less (docs/results.md). 2**25 elements (220 rows of a 152k vocabulary) keeps
# the working set under 1/8 of the plain loss's from N*K = 1,280 entries up.
FUSED_TILE_ELEMENTS = 2**25  # default row chunk = FUSED_TILE_ELEMENTS // V

@dataclass(frozen=True)
class _Setup:
    """Everything the autograd Function needs besides its tensors."""

    statistic: Statistic
    temperature: float
    row_chunk: int  # entries per logits matmul
    tile_rows: int  # entries per statistics tile (whole rows, walked vocab_chunk columns at a time)
    vocab_chunk: int
    dtype: torch.dtype  # accumulation dtype (float32, or float64 for float64 inputs)
    target_is_hidden: bool
    target_softcap: float | None  # Gemma's final_logit_softcapping, applied to hidden targets' logits
    with_alpha: bool  # also return alpha = sum min(p, q) per entry (no gradient)


def _logit_rows(
    hidden: Tensor,  # (r, D)
    target: Tensor,  # (r, D) hidden or (r, V) logits
    weight: Tensor,  # (V, D)
    setup: _Setup,
    out: Tensor,  # (>= 2r, V) scratch in the weight's dtype, overwritten
) -> tuple[Tensor, Tensor]:  # (r, V) draft logits, (r, V) target logits, inputs' dtypes
    """The row chunk's logits; a hidden target shares the draft's matmul (one read of the weight)."""
    rows = hidden.shape[0]
    if not setup.target_is_hidden:
        return torch.mm(hidden, weight.T, out=out[:rows]), target
    both = torch.mm(torch.cat([hidden, target]), weight.T, out=out[: 2 * rows])  # (2r, V)
    draft_logits, target_logits = both.split(rows)
    if setup.target_softcap is not None:  # as bebop.speculative.attention.final_logits
        target_logits.div_(setup.target_softcap).tanh_().mul_(setup.target_softcap)
    return draft_logits, target_logits


def _logits_buffer(hidden: Tensor, weight: Tensor, setup: _Setup) -> Tensor:  # (2 * row chunk, V)
    """Scratch for `_logit_rows`, sized for the largest chunk (draft and hidden target rows)."""
    rows = min(setup.row_chunk, hidden.shape[0]) * (2 if setup.target_is_hidden else 1)
    return weight.new_empty(rows, weight.shape[0])


def _log_norms(draft_logits: Tensor, target_logits: Tensor, log: bool, setup: _Setup):
    """Row logsumexps of z / T and t / T when the tiles need them, else (None, None)."""
    if not _needs_log_norms(draft_logits.shape[-1], setup.vocab_chunk, log):
        return None, None
    return tuple(
        _row_logsumexp(x, setup.temperature, setup.vocab_chunk, setup.dtype)
        for x in (draft_logits, target_logits)
    )


def _tiles(draft_logits: Tensor, target_logits: Tensor, norms, log: bool, setup: _Setup):
    """(columns, q or log q tile, p or log p tile) across the vocabulary, as in `entry_stats`."""
    return _prob_tiles(
        draft_logits, target_logits, *norms, setup.temperature, setup.vocab_chunk, setup.dtype, log
    )


def _row_sums(
    draft_logits: Tensor,  # (r, V)
    target_logits: Tensor,  # (r, V)
    setup: _Setup,
) -> tuple[Tensor, Tensor, Tensor, tuple]:  # value, aux, alpha (r,) each; the log norms
    """The statistic, its aux sum and (with_alpha) the overlap alpha of each row."""
    statistic, log = setup.statistic, setup.statistic.in_log_space
    norms = _log_norms(draft_logits, target_logits, log, setup)
    sums = []
    for _, tile_q, tile_p in _tiles(draft_logits, target_logits, norms, log, setup):
        # NOTE: partial_sums may overwrite its tiles, so alpha is summed first.
        overlap = (
            torch.minimum(tile_q.exp(), tile_p.exp()).sum(-1)
            if log and setup.with_alpha
            else torch.zeros_like(tile_q[:, 0])
        )
        sums.append(torch.stack([*statistic.partial_sums(tile_q, tile_p), overlap]))  # (3, r)
    value, aux, alpha = torch.stack(sums).sum(0)
    return value, aux, (value if not log else alpha), norms


def _overwrite_with_logit_grad(draft_logits, target_logits, norms, value, aux, scale, setup) -> None:
    """draft_logits (r, V) <- scale * d statistic / dz, tile by tile; scale (r,) holds 1/T."""
    statistic, log = setup.statistic, setup.statistic.in_log_space
    for cols, tile_q, tile_p in _tiles(draft_logits, target_logits, norms, log, setup):
        # The tiles are fresh tensors: overwriting the logits they came from is safe.
        draft_logits[:, cols] = statistic.tile_grad(tile_q, tile_p, value, aux, scale)


def _chunk_pass(z, t, out: slice, value, aux, alpha, scale, setup) -> None:
    """Statistics of a row chunk (written to value, aux, alpha at out) and, given scale, its gradient.

    The statistics walk the chunk tile_rows whole rows at a time; with a scale (r,), each tile's
    rows of z are overwritten by scale * d statistic / dz as soon as their statistics are known.
    alpha None: value and aux are already known (the backward), only the tiles' log norms are made.
    """
    for tile in _row_slices(z.shape[0], setup.tile_rows):
        at = slice(out.start + tile.start, out.start + tile.stop)
        if alpha is None:
            norms = _log_norms(z[tile], t[tile], setup.statistic.in_log_space, setup)
        else:
            value[at], aux[at], alpha[at], norms = _row_sums(z[tile], t[tile], setup)
        if scale is not None:
            _overwrite_with_logit_grad(z[tile], t[tile], norms, value[at], aux[at], scale[at], setup)


class _FusedStatisticFunction(torch.autograd.Function):
    """(R, D) draft hidden, target with its (R,) row index, (V, D) weight -> (R,) statistic, (R,) alpha.

    The target (hidden states or logits) is indexed one row chunk at a time, never copied whole.
    """

    @staticmethod
    def forward(ctx, hidden, target, target_rows, weight, setup):
        num_rows, dtype = hidden.shape[0], setup.dtype
        value, aux, alpha = (hidden.new_zeros(num_rows, dtype=dtype) for _ in range(3))
        need_hidden_grad = ctx.needs_input_grad[0]
        jac = hidden.new_zeros(hidden.shape, dtype=dtype) if need_hidden_grad else None  # (R, D)
        scale = value.new_full((num_rows,), 1.0 / setup.temperature) if need_hidden_grad else None
        buffer = _logits_buffer(hidden, weight, setup)
        for rows in _row_slices(num_rows, setup.row_chunk):
            z, t = _logit_rows(hidden[rows], target[target_rows[rows]], weight, setup, buffer)  # (r, V)
            _chunk_pass(z, t, rows, value, aux, alpha, scale, setup)
            if need_hidden_grad:
                # z now holds d statistic / dz: the chain rule through z = hidden @ weight.T, one
                # (r, V) @ (V, D) matmul in the weight's dtype.
                jac[rows] = z @ weight
        keep = ctx.needs_input_grad[3]  # the weight's gradient recomputes the logits
        ctx.save_for_backward(jac, value, aux, *((hidden, target, target_rows, weight) if keep else ()))
        ctx.setup, ctx.hidden_dtype = setup, hidden.dtype
        ctx.mark_non_differentiable(alpha)
        return value, alpha

    @staticmethod
    def backward(ctx, grad_value, grad_alpha):  # grad_value (R,)
        jac, value, aux, *inputs = ctx.saved_tensors
        setup = ctx.setup
        grad_value = grad_value.to(setup.dtype)
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (jac * grad_value[:, None]).to(ctx.hidden_dtype)
        if ctx.needs_input_grad[3]:
            grad_weight = _weight_grad(*inputs, value, aux, grad_value, setup)
        return grad_hidden, None, None, grad_weight, None


def _weight_grad(hidden, target, target_rows, weight, value, aux, grad_value, setup) -> Tensor:  # (V, D)
    """sum_r grad_value_r * d statistic_r / d weight, one recomputed row chunk at a time."""
    grad_weight = weight.new_zeros(weight.shape, dtype=setup.dtype)  # (V, D)
    scale = grad_value / setup.temperature  # (R,)
    buffer = _logits_buffer(hidden, weight, setup)
    for rows in _row_slices(hidden.shape[0], setup.row_chunk):
        z, t = _logit_rows(hidden[rows], target[target_rows[rows]], weight, setup, buffer)
        _chunk_pass(z, t, rows, value, aux, None, scale, setup)  # the forward's statistics, not recomputed
        # (V, r) @ (r, D): z_rc = hidden_r . weight_c, so d/d weight_c = sum_r g_rc hidden_r
        if weight.dtype == setup.dtype:
            grad_weight.addmm_(z.T, hidden[rows])
            continue
        for cols in _row_slices(weight.shape[0], setup.vocab_chunk):  # (C, D) products, upcast
            grad_weight[cols] += (z[:, cols].T @ hidden[rows]).to(setup.dtype)
    return grad_weight.to(weight.dtype)


def _check_inputs(
    name: str,
    draft_hidden: Tensor,  # (N, K, D)
    target: Tensor,  # (N, K, D) or (N, K, V)
    weight: Tensor,  # (V, D)
    target_is_hidden: bool | None,
    temperature: float,
    target_softcap: float | None,
    row_chunk: int | None,
    vocab_chunk: int,
) -> bool:  # whether the target is hidden states
    """Raises ValueError unless the inputs are usable; one host sync per tensor (NaN/inf check)."""
    if name not in DRAFT_LOSS_PARTS:
        raise ValueError(f"unknown draft loss {name!r}; valid names: {sorted(DRAFT_LOSSES)}")
    for label, x, dim in (("draft_hidden", draft_hidden, 3), ("target", target, 3), ("weight", weight, 2)):
        if not isinstance(x, Tensor):
            raise ValueError(f"{label} must be a torch.Tensor, got {type(x).__name__}")
        if x.dim() != dim or not x.is_floating_point():
            raise ValueError(f"{label} must be a {dim}-D floating tensor, got {x.dtype} {tuple(x.shape)}")
        if x.device != weight.device:
            raise ValueError(f"{label} is on {x.device} but the weight is on {weight.device}")
    (vocab, width), lead = weight.shape, tuple(draft_hidden.shape[:2])
    if draft_hidden.shape[-1] != width:
        raise ValueError(f"draft_hidden {tuple(draft_hidden.shape)} does not fit the lm_head weight "
                         f"(V, D) = {tuple(weight.shape)}: its last dimension must be D = {width}")
    if tuple(target.shape[:2]) != lead or target.shape[-1] not in (width, vocab):
        raise ValueError(f"target {tuple(target.shape)} must be hidden states {(*lead, width)} or "
                         f"logits {(*lead, vocab)}")
    if target_is_hidden is None:
        if width == vocab:
            raise ValueError(f"D = V = {width}: say whether target holds hidden states (target_is_hidden)")
        target_is_hidden = target.shape[-1] == width
    if target.shape[-1] != (width if target_is_hidden else vocab):
        raise ValueError(f"target {tuple(target.shape)} does not match target_is_hidden={target_is_hidden}")
    for label, x in (("draft_hidden", draft_hidden), ("target", target)):
        if x.dtype != weight.dtype and (label == "draft_hidden" or target_is_hidden):
            raise ValueError(f"{label} is {x.dtype} but the weight is {weight.dtype}; cast one of them")
    if problem := temperature_problem(temperature, greedy_ok=False):
        raise ValueError(problem)
    if target_softcap is not None and not (target_is_hidden and 0.0 < target_softcap < float("inf")):
        raise ValueError(f"target_softcap must be finite, > 0 and used with a hidden target, got {target_softcap}")
    if (row_chunk is not None and row_chunk < 1) or vocab_chunk < 1:
        raise ValueError(f"row_chunk and vocab_chunk must be >= 1, got {row_chunk}, {vocab_chunk}")
    for label, x in (("draft_hidden", draft_hidden), ("target", target), ("weight", weight)):
        # min and max propagate NaN: one reduction pass sees NaN and inf.
        if x.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(x))).all()):  # sync
            raise ValueError(f"{label} contains NaN or inf")
    return target_is_hidden


def draft_loss_from_hidden(
    name: str,
    draft_hidden: Tensor,  # (N, K, D)
    target: Tensor,  # (N, K, D) hidden states or (N, K, V) logits
    weight: Tensor,  # (V, D)
    mask: Tensor | None = None,  # (N, K) bool
    temperature: float = 1.0,
    *,
    target_is_hidden: bool | None = None,
    target_softcap: float | None = None,
    with_alpha: bool = False,
    row_chunk: int | None = None,
    vocab_chunk: int = VOCAB_CHUNK,
) -> Tensor | tuple[Tensor, Tensor]:
    """``draft_loss(name, draft_hidden @ weight.T, target logits, mask, temperature)``, fused.

    Gradients reach draft_hidden and, when it requires grad, weight; never the target.

    Args:
        name: A key of ``DRAFT_LOSSES``: "ce", "fkl", "rkl", "tv" or "e2e_tv".
        draft_hidden: The draft's lm_head inputs (after any final norm); z = draft_hidden @ weight.T.
        target: The target's lm_head inputs (logits t = target @ weight.T) or its logits t.
        weight: The lm_head weight (no bias: see bebop.mtp.loss for models with one).
        mask: True where the (position, step) entry exists; None means all entries do.
        temperature: Softmax temperature T > 0 applied to both distributions.
        target_is_hidden: Whether target holds hidden states; None infers it from its last
            dimension (D or V), which must then differ.
        target_softcap: Soft-capping c of a hidden target's logits, t <- c tanh(t / c) (Gemma's
            ``final_logit_softcapping``); None for none.
        with_alpha: Also return alpha = sum_v min(p, q) per entry (N, K), detached, 0 outside mask.
        row_chunk: Entries per logits matmul; None fills FUSED_TILE_ELEMENTS.
        vocab_chunk: Vocabulary columns per statistics tile (their rows fill entry_stats.TILE_ELEMENTS).

    Returns:
        The scalar loss in float32 (float64 for float64 inputs), and alpha if ``with_alpha``.

    Raises:
        BebopError: One line, on an unknown name, shapes that do not fit the weight, mismatched
            dtypes or devices, a bad mask, temperature or softcap, or NaN/inf inputs.

    Example:
        >>> h, w = torch.randn(4, 3, 8, requires_grad=True), torch.randn(50, 8)
        >>> draft_loss_from_hidden("e2e_tv", h, torch.randn(4, 3, 8), w).backward()
    """
    try:
        target_is_hidden = _check_inputs(
            name, draft_hidden, target, weight, target_is_hidden, temperature, target_softcap,
            row_chunk, vocab_chunk,
        )
        mask = _resolve_mask(mask, draft_hidden)
    except ValueError as e:
        raise BebopError(f"draft_loss_from_hidden: {e}") from None
    statistic, reduce = DRAFT_LOSS_PARTS[name]
    vocab, (num, depth, width) = weight.shape[0], draft_hidden.shape
    setup = _Setup(
        STATISTICS[statistic], float(temperature),
        row_chunk or max(1, FUSED_TILE_ELEMENTS // vocab), resolve_row_chunk(None, vocab, vocab_chunk),
        vocab_chunk,
        compute_dtype(draft_hidden.dtype, target.dtype, weight.dtype), target_is_hidden,
        None if target_softcap is None else float(target_softcap), with_alpha,
    )
    rows = mask.reshape(-1).nonzero().squeeze(1)  # (R,) valid entries; sync (data-dependent size)
    value_rows, alpha_rows = _FusedStatisticFunction.apply(
        draft_hidden.reshape(-1, width).index_select(0, rows),
        target.detach().reshape(num * depth, target.shape[-1]), rows, weight, setup,
    )
    flat = draft_hidden.new_zeros(num * depth, dtype=setup.dtype)
    value = flat.index_copy(0, rows, value_rows).reshape(num, depth)  # (N, K), 0 outside mask
    loss = reduce(value, mask)
    if not with_alpha:
        return loss
    return loss, flat.index_copy(0, rows, alpha_rows).reshape(num, depth)
