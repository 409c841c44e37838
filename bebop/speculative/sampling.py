"""Token-wise verification (rejection sampling and target-only) and the samplers both verifiers use.

Terms (p is the target's distribution, q the draft's; `bebop.speculative.verification` defines draft,
accepted, recovered, bonus token and accept length; Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; Chen et al. 2023; Bebop, arXiv 2606.12370, §2.2 and App. G):
    RS              rejection sampling: ŷ_j ~ q_j, accepted with probability min(1, p_j(ŷ_j) / q_j(ŷ_j));
                    the recovered token is drawn from the residual norm(max(0, p_j - q_j)), so the
                    emitted token is distributed exactly as p_j.
    TO              target-only: ŷ_j is any token (usually argmax q_j), treated as a one-hot proposal;
                    accepted with probability p_j(ŷ_j), recovered from p_j with ŷ_j removed.

`accept_token_wise` is the token-wise verifier (the "token" entry of `verification.VERIFIERS`):
drafts are checked in order and the first rejection ends the block. `verify_distributions` is its
closed form. `logits_to_probs` makes p (temperature, top-k, top-p) and `sample_from_probs` draws a
token by the exponential race; `stop_rows` and `drafts_with_bonus` serve both verifiers.

Deviations from the textbook algorithm (those of the noise, which block verification shares, are
listed in `bebop.speculative.verification`):
    1) The accept test is u < a with a = min(1, p(ŷ)/q(ŷ)) (SGLang writes u·q < p: the same event up
       to rounding); computing a once lets tests probe the exact threshold. If q(ŷ) = 0 (a sampled
       draft cannot have it) a = 1 when p(ŷ) > 0 and 0 when p(ŷ) = 0, the limit of min(1, p/q) and
       never a NaN.
    2) If the residual max(0, p - q) is all zero, the recovered token is drawn from p (SGLang returns
       token V-1). Exact: Σ max(0, p - q) = 0 means p <= q everywhere, and as both sum to 1, p == q;
       then a = 1 for every token with q > 0, so this branch is reached with probability 0 (only
       through float rounding at the 1e-7 level) and whatever it emits cannot change the output
       distribution; p is the distribution a rejection there would have to reproduce.
    3) TO is RS with q_j = one-hot(ŷ_j): then min(1, p/q) = p(ŷ) and max(0, p - q) = p with ŷ
       zeroed, so one code path serves both.
"""

from __future__ import annotations

import torch

from bebop.speculative import rng
from bebop.speculative.settings import distribution_problems
from bebop.utils.torch_utils import compute_dtype

PAD_TOKEN_ID = -1  # marks unused output slots (after the recovered or bonus token)
RACE_BLOCK_ELEMENTS = 1 << 17  # noise values (rows x tokens) `keyed_race` draws at once: 1 MiB of int64 bits


# ----------------------------------------------------------------------------- samplers


def sample_from_probs(
    probs: torch.Tensor,  # (..., V) non-negative weights, need not sum to 1
    exponential: torch.Tensor,  # (..., V) i.i.d. Exp(1), strictly positive
) -> torch.Tensor:  # (...) int64
    """Draw token i with probability probs[i] / Σ probs by the exponential race argmax(probs / E).

    E_i / probs_i ~ Exp(probs_i) are independent waiting times; the first to finish is i with
    probability probs_i / Σ probs. No normalisation, no host sync. An all-zero row returns 0
    (callers that can produce one fall back first, see `recovery_weights`).

    Example: probs [0, 1, 3] with E [0.5, 1.0, 2.0] -> ratios [0, 1, 1.5] -> token 2.
    """
    if probs.shape != exponential.shape:
        raise ValueError(f"probs {tuple(probs.shape)} and exponential {tuple(exponential.shape)} must match")
    return (probs / exponential).argmax(dim=-1)


def keyed_race(
    probs: torch.Tensor,  # (B, V) non-negative weights, float32 or float64, need not sum to 1
    key: torch.Tensor,  # (B,) int64: each row's stream key at its counter (a column of `rng.counter_keys`)
) -> torch.Tensor:  # (B,) int64
    """`sample_from_probs` with the stream's Exp(1) noise, token for token, without the (B, V) noise tensor:
    the noise is `rng.exponential_from_bits(rng.element_bits(key, 0, V))` cast to the weights' dtype, drawn
    and raced one vocabulary block at a time.

    A block holds about RACE_BLOCK_ELEMENTS values, so its int64 bits and float64 uniforms stay in a core's
    cache; drawn whole, three draft steps' noise at V = 151,936 and B = 16 is 58 MB of bits, hashed in a
    dozen passes over memory (docs/scaling.md). Ties and NaN resolve as one argmax over the row does: the
    first maximal index, a NaN before any number.

    Example: with key = rng.counter_keys(keys[:, 2:3], counters)[:, 0], keyed_race(q, key) ==
    sample_from_probs(q, rng.exponential_from_bits(rng.keyed_bits(keys[:, 2:3], counters, (V,)))[:, 0]).
    """
    batch, vocab = probs.shape
    block = max(1, RACE_BLOCK_ELEMENTS // max(batch, 1))
    if vocab <= block:
        return sample_from_probs(probs, rng.exponential_from_bits(rng.element_bits(key, 0, vocab)).to(probs.dtype))
    best_score = best_token = None
    for start in range(0, vocab, block):
        stop = min(vocab, start + block)
        noise = rng.exponential_from_bits(rng.element_bits(key, start, stop)).to(probs.dtype)
        scores = probs[:, start:stop] / noise
        token = scores.argmax(dim=-1)  # (B,)
        score = scores.gather(-1, token[:, None])[:, 0]
        if best_score is None:
            best_score, best_token = score, token
            continue
        better = (score > best_score) | (score.isnan() & ~best_score.isnan())  # a later block wins only strictly
        best_score = torch.where(better, score, best_score)
        best_token = torch.where(better, token + start, best_token)
    return best_token


def logits_to_probs(
    logits: torch.Tensor,  # (..., V)
    temperature: float,
    top_k: int = 0,
    top_p: float = 1.0,
) -> torch.Tensor:  # (..., V) float32 (float64 for float64 logits), rows sum to 1
    """softmax(logits / temperature), then top-k, then top-p, renormalised.

    Args:
        logits: raw scores; -inf entries get probability 0 (a row of all -inf gives NaN).
        temperature: > 0. Temperature 0 is greedy decoding: use argmax / `greedy_verify`.
        top_k: keep the tokens whose logit is >= the k-th largest; 0 (or >= V) means off. Ties at the
            boundary are all kept, so more than k tokens may survive; the rule does not depend on
            token order.
        top_p: keep the smallest set of most likely tokens whose mass reaches top_p (on the top-k
            renormalised distribution); 1 means off. The most likely token is always kept, and a
            token tied in probability with the least likely kept one is kept too.

    Example: logits [2, 1, 1, 0], temperature 1, top_k=2 keeps tokens 0, 1, 2 (the tie at the
    boundary), giving probs ∝ [e^2, e, e, 0].
    """
    problems = distribution_problems(temperature, top_k, top_p, greedy_ok=False)  # greedy: use argmax
    if problems:
        raise ValueError("; ".join(problems))
    scaled = logits.to(compute_dtype(logits)) / temperature
    if 0 < top_k < scaled.shape[-1]:
        kth_largest = scaled.topk(top_k, dim=-1).values[..., -1:]  # (..., 1)
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1:
        sorted_probs = probs.sort(dim=-1, descending=True).values  # (..., V)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        # NOTE: mass_before is 0 for the top token, so at least one token is always kept.
        kept = mass_before < top_p
        smallest_kept = sorted_probs.masked_fill(~kept, float("inf")).amin(-1, keepdim=True)  # (..., 1)
        probs = probs.masked_fill(probs < smallest_kept, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


# ----------------------------------------------------------------------------- verification math


def acceptance_probs(
    target_probs: torch.Tensor,  # (B, K+1, V) or (B, K, V); only the first K rows are read
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None = None,  # (B, K, V); None = target-only
) -> torch.Tensor:  # (B, K) in [0, 1]
    """Probability of accepting each draft: min(1, p_j(ŷ_j) / q_j(ŷ_j)) (RS) or p_j(ŷ_j) (TO).

    If q_j(ŷ_j) = 0 the result is 1 when p_j(ŷ_j) > 0 and 0 otherwise (deviation 3).

    Example: p_1 = [0.2, 0.8], q_1 = [0.5, 0.5], ŷ_1 = 0 -> 0.4 (RS); ŷ_1 = 1 -> 1.0; TO, ŷ_1 = 0 -> 0.2.
    """
    k = draft_tokens.shape[1]
    index = draft_tokens[..., None]  # (B, K, 1)
    dtype = compute_dtype(target_probs, draft_probs)
    p_draft = target_probs[:, :k].gather(-1, index).squeeze(-1).to(dtype)  # (B, K)
    if draft_probs is None:
        return p_draft.clamp(0.0, 1.0)
    q_draft = draft_probs.gather(-1, index).squeeze(-1).to(dtype)  # (B, K)
    q_positive = q_draft > 0
    ratio = p_draft / torch.where(q_positive, q_draft, 1.0)
    ratio = torch.where(q_positive, ratio, (p_draft > 0).to(dtype))
    return ratio.clamp(max=1.0)


def recovery_weights(
    target_probs: torch.Tensor,  # (..., V) p at the stop position
    draft_tokens: torch.Tensor,  # (...) int64 ŷ there; PAD_TOKEN_ID = no draft (the bonus position)
    draft_probs: torch.Tensor | None = None,  # (..., V) q there; None = target-only
) -> torch.Tensor:  # (..., V) non-negative, unnormalised, never all zero for a valid p
    """Weights of the token emitted at the stop position: max(0, p - q) after a rejection (RS),
    p with ŷ zeroed (TO), p itself at the bonus position; p again if the residual is all zero
    (deviation 4).

    Example: p = [0.2, 0.8], q = [0.5, 0.5] -> [0, 0.3]; TO with ŷ = 1 -> [0.2, 0]; ŷ = PAD -> p.
    """
    p = target_probs.to(compute_dtype(target_probs, draft_probs))
    if draft_probs is None:
        vocab_ids = torch.arange(p.shape[-1], device=p.device)  # (V,)
        weights = p.masked_fill(vocab_ids == draft_tokens[..., None], 0.0)  # PAD never matches
    else:
        weights = (p - draft_probs.to(p.dtype)).clamp_min(0.0)
        weights = torch.where((draft_tokens == PAD_TOKEN_ID)[..., None], p, weights)
    degenerate = weights.sum(-1, keepdim=True) <= 0  # (..., 1)
    return torch.where(degenerate, p, weights)


def verify_distributions(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None = None,  # (B, K, V); None = target-only
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K), (B, K+1, V)
    """The whole token-wise verify step in closed form, for tests and analysis (inputs are not checked).

    Returns:
        accept: (B, K) probability that draft j is accepted given drafts 1..j-1 were.
        resample: (B, K+1, V) distribution of the token emitted if the block stops at j: the
            normalised recovery distribution for j < K, p_{K+1} (bonus) for j = K.
    `accept_token_wise` uses the same `acceptance_probs` and `recovery_weights`.
    """
    batch, vocab = target_probs.shape[0], target_probs.shape[2]
    accept = acceptance_probs(target_probs, draft_tokens, draft_probs)
    q_with_bonus = None
    if draft_probs is not None:
        zeros = draft_probs.new_zeros(batch, 1, vocab)
        q_with_bonus = torch.cat([draft_probs, zeros], dim=1)  # (B, K+1, V)
    weights = recovery_weights(target_probs, drafts_with_bonus(draft_tokens), q_with_bonus)
    return accept, weights / weights.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------- the token-wise verifier


def accept_token_wise(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None,  # (B, K, V); None = target-only
    uniform: torch.Tensor,  # (B, K) in (0, 1): accept coins
) -> tuple[torch.Tensor, torch.Tensor]:  # (B,) int64, (B, V)
    """How many drafts each row accepts, and the weights of the token it emits next.

    Draft j is accepted iff uniform[:, j] < `acceptance_probs`[:, j], in order, up to the first
    rejection; the emitted token's weights are `recovery_weights` at the stop position (p_{K+1} after
    K accepts). `verification.verify_from_noise` checks the inputs and draws the token.

    Example: acceptances [0.4, 1.0]: coins [0.3, 0.9] accept both (weights p_3, the bonus row);
    coins [0.5, 0.1] accept none (weights max(0, p_1 - q_1)).
    """
    accepted = uniform < acceptance_probs(target_probs, draft_tokens, draft_probs)  # (B, K)
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # (B,) length of the accepted prefix
    p_stop, q_stop = stop_rows(target_probs, draft_probs, num_accepted)
    stop_token = drafts_with_bonus(draft_tokens).gather(1, num_accepted[:, None])[:, 0]  # (B,) PAD at the bonus
    return num_accepted, recovery_weights(p_stop, stop_token, q_stop)


def drafts_with_bonus(
    draft_tokens: torch.Tensor,  # (B, K) int64
) -> torch.Tensor:  # (B, K+1) int64
    """The drafts with PAD_TOKEN_ID at the bonus position. Example: [[5, 8]] -> [[5, 8, -1]]."""
    pad = draft_tokens.new_full((draft_tokens.shape[0], 1), PAD_TOKEN_ID)
    return torch.cat([draft_tokens, pad], dim=1)


def stop_rows(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_probs: torch.Tensor | None,  # (B, K, V); None = target-only
    num_accepted: torch.Tensor,  # (B,) int64 in 0..K: the stop position
) -> tuple[torch.Tensor, torch.Tensor | None]:  # (B, V), (B, V) or None
    """p and q of the position each row stops at. The bonus position (num_accepted = K) has no q: the
    row's last q stands in (the verifiers read p alone there), zeros when K = 0."""
    batch, k_plus_1, vocab = target_probs.shape
    rows = torch.arange(batch, device=target_probs.device)
    q_stop = None
    if draft_probs is not None and k_plus_1 > 1:
        q_stop = draft_probs[rows, num_accepted.clamp(max=k_plus_1 - 2)]
    elif draft_probs is not None:
        q_stop = draft_probs.new_zeros(batch, vocab)
    return target_probs[rows, num_accepted], q_stop
