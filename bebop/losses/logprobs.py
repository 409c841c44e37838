"""Token log-probabilities fused with the lm_head: a policy's log pi(token) from hidden states, never (N, V).

    logprobs = token_logprobs_from_hidden(hidden, lm_head.weight, tokens, temperature)  # (N, D) -> (N,)

log pi(y_n) = u_{n, y_n} - logsumexp_v u_{n, v} with u = z / T and z = hidden @ weight.T (the lm_head),
optionally soft-capped first (Gemma's ``final_logit_softcapping``: z <- c tanh(z / c), as
``bebop.speculative.attention.final_logits``). GRPO needs it with gradient for the policy, and without
for the old and reference policies (``bebop.rollout.logprobs.token_logprobs``); its entropy
H_n = logsumexp_v u_{n, v} - sum_v pi_v u_{n, v} comes from the same tiles. The rows run in chunks of
``FUSED_TILE_ELEMENTS // V`` (the draft loss's row chunk, ``bebop.losses.fused``), whose logits
live in one buffer every chunk reuses, so the working set is one chunk's logits whatever N is.

The backward recomputes each chunk's logits (the forward keeps only the inputs and the row
logsumexps): d log pi(y) / du = onehot(y) - pi, times 1 / T, times 1 - tanh^2 under the soft-cap;
then one (r, V) @ (V, D) matmul gives the hidden states' gradient and one (V, r) @ (r, D) adds the
weight's (the lm_head is trained with the policy; with tied embeddings the gradient reaches the
embedding as autograd's would).

Where this deviates from ``log_softmax(lm_head(hidden).float() / T).gather(tokens)``:
1) Logits are made in the inputs' dtype (bfloat16 weights give the bfloat16 logits the model's own
   lm_head gives, soft-capped in that dtype as HF's Gemma does), then upcast: every sum accumulates
   in float32 (float64 for float64 inputs), and so does the weight's gradient across chunks.
2) The entropy has no gradient (it is logged, not optimised).
"""

from __future__ import annotations

import torch
from torch import Tensor

from bebop.config import temperature_problem
from bebop.losses.entry_stats import _row_slices
from bebop.losses.fused import FUSED_TILE_ELEMENTS
from bebop.utils.torch_utils import compute_dtype


def _chunk_scores(
    hidden: Tensor,  # (r, D)
    weight: Tensor,  # (V, D)
    buffer: Tensor,  # (>= r, V) scratch in the weight's dtype, overwritten
    temperature: float,
    softcap: float | None,
    dtype: torch.dtype,
) -> Tensor:  # (r, V) u = softcap(z) / T in dtype
    """One row chunk's tempered logits, made in the buffer (the weight's dtype) and upcast into a copy when
    dtype is wider; either way the caller may overwrite the result until the next chunk."""
    logits = torch.mm(hidden, weight.T, out=buffer[: hidden.shape[0]])
    if softcap is not None:
        logits.div_(softcap).tanh_().mul_(softcap)
    scores = logits if logits.dtype == dtype else logits.to(dtype)
    return scores.div_(temperature) if temperature != 1.0 else scores


class _TokenLogprobFunction(torch.autograd.Function):
    """(N, D) hidden, (V, D) weight, (N,) tokens -> (N,) log pi(token), (N,) entropy (no gradient)."""

    @staticmethod
    def forward(ctx, hidden, weight, tokens, temperature, softcap, row_chunk, with_entropy):
        dtype = compute_dtype(hidden.dtype, weight.dtype)
        num_rows = hidden.shape[0]
        log_norm, picked, entropy = (hidden.new_zeros(num_rows, dtype=dtype) for _ in range(3))
        buffer = weight.new_empty(min(row_chunk, max(num_rows, 1)), weight.shape[0])
        for rows in _row_slices(num_rows, row_chunk):
            scores = _chunk_scores(hidden[rows], weight, buffer, temperature, softcap, dtype)  # (r, V)
            log_norm[rows] = torch.logsumexp(scores, dim=-1)
            picked[rows] = scores.gather(1, tokens[rows, None]).squeeze(1)
            if with_entropy:  # H = log Z - sum pi u, pi = exp(u - log Z)
                mean_score = (scores - log_norm[rows, None]).exp_().mul_(scores).sum(-1)
                entropy[rows] = log_norm[rows] - mean_score
        ctx.save_for_backward(hidden, weight, tokens, log_norm)
        ctx.setup = (temperature, softcap, row_chunk, dtype)
        ctx.mark_non_differentiable(entropy)
        return picked - log_norm, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):  # grad_logprobs (N,)
        hidden, weight, tokens, log_norm = ctx.saved_tensors
        temperature, softcap, row_chunk, dtype = ctx.setup
        need_hidden, need_weight = ctx.needs_input_grad[:2]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = weight.new_zeros(weight.shape, dtype=dtype) if need_weight else None  # (V, D)
        scale = grad_logprobs.to(dtype) / temperature  # (N,) d/dz = (d/du) / T
        buffer = weight.new_empty(min(row_chunk, max(hidden.shape[0], 1)), weight.shape[0])
        for rows in _row_slices(hidden.shape[0], row_chunk):
            scores = _chunk_scores(hidden[rows], weight, buffer, temperature, softcap, dtype)  # (r, V)
            cap_grad = None
            if softcap is not None:  # d c tanh(x / c) / dx = 1 - tanh^2 = 1 - (u T / c)^2
                cap_grad = (scores * (temperature / softcap)).square_().neg_().add_(1.0)
            grad = scores.sub_(log_norm[rows, None]).exp_().neg_()  # (r, V) -pi
            grad.scatter_add_(1, tokens[rows, None], grad.new_ones(grad.shape[0], 1))  # onehot - pi
            grad.mul_(scale[rows, None])
            if cap_grad is not None:
                grad.mul_(cap_grad)
            grad = grad.to(weight.dtype)  # NOTE: meets the weight in its dtype, as autograd through the lm_head
            if need_hidden:
                grad_hidden[rows] = grad @ weight
            if need_weight:
                _add_weight_grad(grad_weight, grad, hidden[rows])
        if need_weight:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def _add_weight_grad(
    grad_weight: Tensor,  # (V, D) accumulator, float32 or wider
    grad: Tensor,  # (r, V) d/dz in the weight's dtype
    hidden: Tensor,  # (r, D)
) -> None:
    """grad_weight += grad.T @ hidden: z_rc = hidden_r . weight_c, so d/d weight_c = sum_r g_rc hidden_r."""
    if grad.dtype == grad_weight.dtype:
        grad_weight.addmm_(grad.T, hidden)
    else:  # the product in the weight's dtype, added in the accumulation dtype
        grad_weight += (grad.T @ hidden).to(grad_weight.dtype)


def _check_inputs(hidden: Tensor, weight: Tensor, tokens: Tensor, temperature: float, softcap: float | None,
                  row_chunk: int | None) -> None:
    """Raises ValueError unless the inputs fit together; no host sync."""
    if hidden.dim() != 2 or weight.dim() != 2 or tokens.dim() != 1:
        raise ValueError(f"hidden (N, D), weight (V, D) and tokens (N,) expected, got {tuple(hidden.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(tokens.shape)}")
    if hidden.shape[1] != weight.shape[1] or hidden.shape[0] != tokens.shape[0]:
        raise ValueError(f"hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)} and tokens "
                         f"{tuple(tokens.shape)} do not fit together")
    if hidden.dtype != weight.dtype or hidden.device != weight.device or tokens.device != weight.device:
        raise ValueError(f"hidden ({hidden.dtype}, {hidden.device}) and weight ({weight.dtype}, {weight.device}) "
                         f"and tokens ({tokens.device}) must share the weight's dtype and device")
    if tokens.dtype != torch.long:
        raise ValueError(f"tokens must be int64, got {tokens.dtype}")
    if problem := temperature_problem(temperature, greedy_ok=False):
        raise ValueError(problem)
    if softcap is not None and not 0.0 < softcap < float("inf"):
        raise ValueError(f"softcap must be finite and > 0, got {softcap}")
    if row_chunk is not None and row_chunk < 1:
        raise ValueError(f"row_chunk must be >= 1, got {row_chunk}")


def token_logprobs_from_hidden(
    hidden: Tensor,  # (N, D)
    weight: Tensor,  # (V, D)
    tokens: Tensor,  # (N,) int64
    temperature: float = 1.0,
    *,
    softcap: float | None = None,
    with_entropy: bool = False,
    row_chunk: int | None = None,
) -> Tensor | tuple[Tensor, Tensor]:
    """log softmax(softcap(hidden @ weight.T) / T) at ``tokens``, tiled over rows; gradients reach both inputs.

    Token ids are not range-checked here (a gather raises on an id outside [0, V)).

    Args:
        hidden: the lm_head's inputs (the decoder's final normed hidden states) of the scored positions.
        weight: the lm_head weight (no bias).
        tokens: the token each row scores.
        temperature: T > 0; the distribution sampled from is softmax(logits / T).
        softcap: c of Gemma's final logit soft-capping, z <- c tanh(z / c); None for none.
        with_entropy: also return the entropy of softmax(logits / T) per row (no gradient).
        row_chunk: rows per logits matmul; None fills FUSED_TILE_ELEMENTS.

    Returns:
        The (N,) log-probabilities in float32 (float64 for float64 inputs), and the (N,) entropies
        in nats if ``with_entropy``.

    Example (hand-checked in tests/losses/test_logprobs.py): hidden [[1, 0]], weight rows
    [1, 0], [0, 1], [0, 0] give logits (1, 0, 0), so token 0 has log(e / (e + 2)) = -0.5514.
    """
    _check_inputs(hidden, weight, tokens, temperature, softcap, row_chunk)
    chunk = row_chunk or max(1, FUSED_TILE_ELEMENTS // weight.shape[0])
    logprobs, entropy = _TokenLogprobFunction.apply(
        hidden, weight, tokens, float(temperature), None if softcap is None else float(softcap), chunk, with_entropy
    )
    return (logprobs, entropy) if with_entropy else logprobs
