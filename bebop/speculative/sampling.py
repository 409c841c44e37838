"""Draft verification: rejection sampling, target-only and greedy, plus the samplers they share.

Terms (p is the target's distribution, q the draft's; Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; Chen et al. 2023; Bebop, arXiv 2606.12370, §2.2 and App. G):
    draft           a token ŷ_j proposed for position j = 1..K by a cheap model (MTP heads, a draft
                    model, n-grams: verification does not care which).
    accepted        a draft kept after verification; drafts are checked in order and the first
                    rejection ends the block.
    recovered       the token emitted at the first rejected position, drawn from the residual
                    norm(max(0, p_j - q_j)); with it the emitted token is distributed exactly as p_j.
    bonus token     the token drawn from p_{K+1} (the target's row after the last draft) when all K
                    drafts are accepted.
    accept length   1 + num_accepted: tokens emitted per verify step (vLLM/SGLang convention), in 1..K+1.
    RS              rejection sampling: ŷ_j ~ q_j, accepted with probability min(1, p_j(ŷ_j) / q_j(ŷ_j)).
    TO              target-only: ŷ_j is any token (usually argmax q_j), treated as a one-hot proposal;
                    accepted with probability p_j(ŷ_j), recovered from p_j with ŷ_j removed.

Randomness is kept apart from the math: `rejection_sample_from_noise` is a deterministic function of
the probabilities and the noise (K uniforms and one Exp(1) vector per row). `rejection_sample` draws
that noise from a `torch.Generator`; `rejection_sample_seeded` draws it from the counter-based
`bebop.speculative.rng`, so a row's tokens do not depend on its batch. Stream layout for the engine:
    STREAM_ACCEPT    uniform (B, K)   accept coins of one verify step
    STREAM_RESAMPLE  Exp(1) (B, V)    the recovered or bonus token of one verify step
    STREAM_DRAFT + j Exp(1) (B, V)    draft step j (0-based) of the same block, ŷ = argmax(q_j / E)
all at counter = the row's decode position when the block starts (the number of tokens it has
emitted). Every verify step emits at least one token, so a row never reuses a (stream, counter).

Deviations from the textbook algorithm:
    1) One Exp(1) vector per row serves the single categorical draw of a verify step (recovered at
       the stop position, or bonus), not one per position. Exact: the stop position is a function
       of the coins and drafts only, so the vector is fresh Exp(1) noise for whichever row of p is
       chosen. It saves K of K+1 vocabulary-sized noise vectors.
    2) Categorical draws use the exponential race argmax(w / E), E ~ Exp(1) i.i.d. (equivalently
       Gumbel-max): exact for any non-negative weights, needs no normalisation and no host sync.
       SGLang inverts the CDF; vLLM uses Gumbel-max on logits.
    3) The accept test is u < a with a = min(1, p(ŷ)/q(ŷ)) (SGLang writes u·q < p: the same event up
       to rounding); computing a once lets tests probe the exact threshold. If q(ŷ) = 0 (a sampled
       draft cannot have it) a = 1 when p(ŷ) > 0 and 0 when p(ŷ) = 0, the limit of min(1, p/q) and
       never a NaN.
    4) If the residual max(0, p - q) is all zero, the recovered token is drawn from p (SGLang returns
       token V-1). Exact: Σ max(0, p - q) = 0 means p <= q everywhere, and as both sum to 1, p == q;
       then a = 1 for every token with q > 0, so this branch is reached with probability 0 (only
       through float rounding at the 1e-7 level) and whatever it emits cannot change the output
       distribution; p is the distribution a rejection there would have to reproduce.
    5) TO is RS with q_j = one-hot(ŷ_j): then min(1, p/q) = p(ŷ) and max(0, p - q) = p with ŷ
       zeroed, so one code path serves both.
"""

from __future__ import annotations

import torch

from bebop.speculative import rng
from bebop.speculative.settings import distribution_problems

PAD_TOKEN_ID = -1  # marks unused output slots (after the recovered or bonus token)
PROB_SUM_TOLERANCE = 1e-3  # |Σ p - 1| allowed: float32 softmax over 256k tokens errs by ~1e-5;
# a larger error means unnormalised weights were passed, which would break exactness silently.
STREAM_ACCEPT = 0  # rng stream of the accept coins, (B, K) uniforms per verify step
STREAM_RESAMPLE = 1  # rng stream of the recovered/bonus draw, one (B, V) Exp(1) vector per verify step
STREAM_DRAFT = 2  # draft step j (0-based) of a block uses rng stream STREAM_DRAFT + j
COIN_DTYPE = torch.float64  # accept coins on a 2^-53 grid: P(u < a) = a to 1e-16, and (B, K) is tiny


# ----------------------------------------------------------------------------- input checks


def _compute_dtype(*tensors: torch.Tensor | None) -> torch.dtype:
    """float32, or float64 when an input is float64: half precision is upcast for the math."""
    dtype = torch.float32
    for t in tensors:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _check_probs_shape(x: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")


def _check_verify_shapes(
    target: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K)
    draft_probs: torch.Tensor | None,  # (B, K, V)
    name: str = "target_probs",
) -> tuple[int, int, int]:
    if not isinstance(target, torch.Tensor) or target.dim() != 3 or target.shape[1] < 1:
        raise ValueError(f"{name} must be (B, K+1, V), got {getattr(target, 'shape', type(target))}")
    batch, k_plus_1, vocab = target.shape
    if vocab < 1:
        raise ValueError(f"{name} has an empty vocabulary dimension")
    k = k_plus_1 - 1
    if not isinstance(draft_tokens, torch.Tensor) or draft_tokens.dtype != torch.int64:
        raise ValueError(f"draft_tokens must be an int64 tensor, got {getattr(draft_tokens, 'dtype', None)}")
    if tuple(draft_tokens.shape) != (batch, k):
        raise ValueError(
            f"draft_tokens must be (B, K) = {(batch, k)} to match {name} {tuple(target.shape)}, "
            f"got {tuple(draft_tokens.shape)}"
        )
    _check_probs_shape(target, name, (batch, k_plus_1, vocab))
    if draft_probs is not None:
        _check_probs_shape(draft_probs, "draft_probs", (batch, k, vocab))
    for t in (draft_tokens, draft_probs):
        if t is not None and t.device != target.device:
            raise ValueError(f"all inputs must be on {target.device}, got one on {t.device}")
    return batch, k, vocab


def _raise_failed(checks: list[tuple[torch.Tensor, str]]) -> None:
    """Evaluate boolean scalar tensors with one host sync (`.tolist()`), raise on the first False."""
    if not checks:
        return
    results = torch.stack([c for c, _ in checks]).tolist()  # NOTE: the one sync point of validation
    for ok, (_, message) in zip(results, checks):
        if not ok:
            raise ValueError(message)


def _prob_checks(x: torch.Tensor, name: str) -> list[tuple[torch.Tensor, str]]:
    sums = x.to(_compute_dtype(x)).sum(-1)
    return [
        (torch.isfinite(x).all(), f"{name} contains NaN or inf"),
        ((x >= 0).all(), f"{name} contains negative values"),
        (((sums - 1).abs() <= PROB_SUM_TOLERANCE).all(),
         f"{name} rows must sum to 1 (±{PROB_SUM_TOLERANCE})"),
    ]


def _token_checks(tokens: torch.Tensor, vocab: int) -> list[tuple[torch.Tensor, str]]:
    in_range = ((tokens >= 0) & (tokens < vocab)).all()
    return [(in_range, f"draft_tokens must lie in [0, {vocab})")]


def finite_at_drafts(
    draft_probs: torch.Tensor,  # (B, K, V) q, from softmax (optionally top-k/top-p filtered)
    draft_tokens: torch.Tensor,  # (B, K) int64
) -> torch.Tensor:  # (B,) bool
    """Whether each row's draft distributions are finite, read at the drafted tokens only: (B, K)
    values instead of (B, K, V), and no host sync.

    NOTE: enough for q made by softmax: one NaN or inf logit makes the normaliser NaN and with it
    the whole row (top-k/top-p keep it so), so a non-finite row is non-finite at its draft too.

    Example: q = [[[nan, nan]]], draft [[1]] -> [False]; q = [[[0.5, 0.5]]] -> [True].
    """
    return torch.isfinite(draft_probs.gather(-1, draft_tokens[..., None])).all(-1).all(-1)


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
    scaled = logits.to(_compute_dtype(logits)) / temperature
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
    dtype = _compute_dtype(target_probs, draft_probs)
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
    p = target_probs.to(_compute_dtype(target_probs, draft_probs))
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
    """The whole verify step in closed form, for tests and analysis.

    Returns:
        accept: (B, K) probability that draft j is accepted given drafts 1..j-1 were.
        resample: (B, K+1, V) distribution of the token emitted if the block stops at j: the
            normalised recovery distribution for j < K, p_{K+1} (bonus) for j = K.
    The samplers use the same `acceptance_probs` and `recovery_weights`.
    """
    _check_verify_shapes(target_probs, draft_tokens, draft_probs)
    batch, vocab = target_probs.shape[0], target_probs.shape[2]
    accept = acceptance_probs(target_probs, draft_tokens, draft_probs)
    pad = torch.full((batch, 1), PAD_TOKEN_ID, dtype=torch.int64, device=draft_tokens.device)
    tokens_with_bonus = torch.cat([draft_tokens, pad], dim=1)  # (B, K+1)
    q_with_bonus = None
    if draft_probs is not None:
        zeros = draft_probs.new_zeros(batch, 1, vocab)
        q_with_bonus = torch.cat([draft_probs, zeros], dim=1)  # (B, K+1, V)
    weights = recovery_weights(target_probs, tokens_with_bonus, q_with_bonus)
    return accept, weights / weights.sum(-1, keepdim=True)


# ----------------------------------------------------------------------------- verify ops


def rejection_sample_from_noise(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None,  # (B, K, V); None = target-only
    uniform: torch.Tensor,  # (B, K) in (0, 1): accept coins
    exponential: torch.Tensor,  # (B, V) Exp(1) > 0: the recovered/bonus draw
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """Verify drafts, deterministically given the noise; see the module docstring for the rules.

    Args:
        target_probs: p at each draft position and the bonus position, after the user's
            temperature/top-k/top-p: the output follows exactly this.
        draft_tokens: ŷ; under RS each ŷ_j must have been drawn from draft_probs[:, j].
        draft_probs: q, exactly the distribution ŷ was drawn from; None = target-only.
        uniform, exponential: the noise; draft j is accepted iff uniform[:, j] < acceptance.
        validate: check values too (NaN, negatives, sums, token range, noise range) at the cost
            of one host sync; shapes and dtypes are always checked.

    Returns:
        output_tokens: (B, K+1) accepted drafts, then the recovered or bonus token, then PAD_TOKEN_ID.
        num_accepted: (B,) in 0..K; the row emitted num_accepted + 1 tokens.
    """
    batch, k, vocab = _check_verify_shapes(target_probs, draft_tokens, draft_probs)
    _check_probs_shape(uniform, "uniform", (batch, k))
    _check_probs_shape(exponential, "exponential", (batch, vocab))
    if validate:
        checks = _prob_checks(target_probs, "target_probs") + _token_checks(draft_tokens, vocab)
        if draft_probs is not None:
            checks += _prob_checks(draft_probs, "draft_probs")
        checks += [
            (((uniform > 0) & (uniform < 1)).all(), "uniform noise must lie in (0, 1)"),
            ((exponential > 0).all(), "exponential noise must be > 0 (and not NaN)"),
        ]
        _raise_failed(checks)

    accept = acceptance_probs(target_probs, draft_tokens, draft_probs)  # (B, K)
    accepted = uniform < accept
    num_accepted = accepted.long().cumprod(dim=1).sum(dim=1)  # (B,) length of the accepted prefix
    rows = torch.arange(batch, device=target_probs.device)
    pad = torch.full((batch, 1), PAD_TOKEN_ID, dtype=torch.int64, device=draft_tokens.device)
    tokens_with_bonus = torch.cat([draft_tokens, pad], dim=1)  # (B, K+1)
    stop_token = tokens_with_bonus[rows, num_accepted]  # (B,) ŷ at the stop position, PAD at bonus
    q_stop = None
    if draft_probs is not None and k > 0:
        q_stop = draft_probs[rows, num_accepted.clamp(max=k - 1)]  # (B, V); unused at bonus
    elif draft_probs is not None:
        q_stop = draft_probs.new_zeros(batch, vocab)
    weights = recovery_weights(target_probs[rows, num_accepted], stop_token, q_stop)  # (B, V)
    emitted = sample_from_probs(weights, exponential.to(weights.dtype))  # (B,)

    positions = torch.arange(k + 1, device=target_probs.device)  # (K+1,)
    stop = num_accepted[:, None]  # (B, 1)
    output = torch.where(positions < stop, tokens_with_bonus, PAD_TOKEN_ID)
    output = torch.where(positions == stop, emitted[:, None], output)
    return output, num_accepted


def draw_verify_noise(
    seeds: torch.Tensor,  # (B,) int64
    counters: torch.Tensor,  # (B,) int64, the rows' decode positions
    k: int,  # K, drafts per row
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K) float64, (B, V) float32
    """Batch-independent noise for one verify step: accept coins and the recovered/bonus draw."""
    coins = rng.uniform(seeds, STREAM_ACCEPT, counters, (k,), COIN_DTYPE)
    race = rng.exponential(seeds, STREAM_RESAMPLE, counters, (vocab_size,))
    return coins, race


def draw_draft_noise(
    seeds: torch.Tensor,  # (B,) int64
    counters: torch.Tensor,  # (B,) int64, the rows' decode positions at the start of the block
    step: int,
    vocab_size: int,
) -> torch.Tensor:  # (B, V) float32 Exp(1)
    """Batch-independent noise for draft step `step` (0-based): ŷ = sample_from_probs(q, noise)."""
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return rng.exponential(seeds, STREAM_DRAFT + step, counters, (vocab_size,))


def rejection_sample(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None = None,  # (B, K, V); None = target-only
    generator: torch.Generator | None = None,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """Rejection sampling (draft_probs given) or target-only verification, noise from `generator`.

    The noise is drawn in call order, so a row's tokens depend on the batch it is in; use
    `rejection_sample_seeded` for batch-independent results. generator=None uses torch's default
    generator. Args and returns as in `rejection_sample_from_noise`.
    """
    batch, k, vocab = _check_verify_shapes(target_probs, draft_tokens, draft_probs)
    device = target_probs.device
    # Draw bits and map them like bebop.speculative.rng does, so both paths share one noise format.
    coin_bits = torch.randint(0, 1 << 52, (batch, k), generator=generator, device=device)
    race_bits = torch.randint(0, 1 << 52, (batch, vocab), generator=generator, device=device)
    coins = rng.uniform_from_bits(coin_bits, COIN_DTYPE)
    race = rng.exponential_from_bits(race_bits)
    return rejection_sample_from_noise(
        target_probs, draft_tokens, draft_probs, coins, race, validate=validate
    )


def rejection_sample_seeded(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None,  # (B, K, V); None = target-only
    seeds: torch.Tensor,  # (B,) int64, from rng.derive_seeds
    counters: torch.Tensor,  # (B,) int64, the rows' decode positions
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """As `rejection_sample`, noise from (seeds, counters): a row's result does not depend on its batch."""
    _, k, vocab = _check_verify_shapes(target_probs, draft_tokens, draft_probs)
    coins, race = draw_verify_noise(seeds, counters, k, vocab)
    return rejection_sample_from_noise(
        target_probs, draft_tokens, draft_probs, coins, race, validate=validate
    )


def greedy_verify(
    target_logits_or_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """Temperature-0 verification: accept draft j iff it equals the target's argmax at j; then emit
    the target's argmax at the first mismatch (or the bonus position). Ties go to the lowest token
    id (torch.argmax). The output equals plain greedy decoding.

    Example: argmax rows [5, 7, 9], drafts [5, 8] -> output [5, 7, -1], num_accepted 1.
    """
    batch, k, vocab = _check_verify_shapes(target_logits_or_probs, draft_tokens, None,
                                                   name="target_logits_or_probs")
    if validate:
        _raise_failed(
            [(~torch.isnan(target_logits_or_probs).any(), "target_logits_or_probs contains NaN")]
            + _token_checks(draft_tokens, vocab)
        )
    target_argmax = target_logits_or_probs.argmax(dim=-1)  # (B, K+1)
    matches = draft_tokens == target_argmax[:, :k]  # (B, K)
    num_accepted = matches.long().cumprod(dim=1).sum(dim=1)  # (B,)
    positions = torch.arange(k + 1, device=draft_tokens.device)
    # NOTE: accepted drafts equal the argmax, so the output is the argmax up to the stop position.
    output = torch.where(positions <= num_accepted[:, None], target_argmax, PAD_TOKEN_ID)
    return output, num_accepted
