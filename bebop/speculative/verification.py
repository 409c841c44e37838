"""One verify step, whichever verifier: input checks, noise, the verifier, the emitted token, the output.

Terms (p is the target's distribution, q the draft's; Leviathan et al. 2023, "Fast Inference from
Transformers via Speculative Decoding"; Chen et al. 2023; Bebop, arXiv 2606.12370, §2.2 and App. G):
    draft           a token ŷ_j proposed for position j = 1..K by a cheap model (MTP heads, a draft
                    model, n-grams: verification does not care which).
    accepted        a draft kept after verification; the accepted drafts are a prefix ŷ_1..ŷ_n.
    recovered       the token emitted after the accepted prefix when it ends before K, drawn so that
                    the output is distributed exactly as p: token-wise from the residual
                    norm(max(0, p_j - q_j)), block verification from its block residual.
    bonus token     the token drawn from p_{K+1} (the target's row after the last draft) when all K
                    drafts are accepted.
    accept length   1 + num_accepted: tokens emitted per verify step (vLLM/SGLang convention), in 1..K+1.
    verifier        the rule that decides, from p, q, the drafts and one uniform coin per draft, how
                    many drafts each row accepts and the weights of the one token it emits next:
                    token-wise rejection sampling (`sampling.accept_token_wise`, RS and TO) or block
                    verification (`block.accept_block`). `VERIFIERS` maps `SpecConfig.verify` to one;
                    a caller looks it up once.

Every verify step has one shape (`verify_from_noise`): check the inputs, ask the verifier, draw the
emitted token by the exponential race over its weights, and lay out [accepted drafts, emitted token,
PAD_TOKEN_ID...]. The noise is an argument: `rejection_sample` and `block_verify` draw it from a
`torch.Generator` in call order; the engine's step (`verify_keyed`) and its drafter draw it from the
counter-based `bebop.speculative.rng` (`draw_coins`, `sampling.keyed_race`), so a row's tokens do not
depend on its batch. Stream layout of `noise_keys` (a stream's column is its number):
    STREAM_ACCEPT    uniform (B, K)   accept coins of one verify step
    STREAM_RESAMPLE  Exp(1) (B, V)    the recovered or bonus token of one verify step (a plain step's token)
    STREAM_DRAFT + j Exp(1) (B, V)    draft step j (0-based) of the same block, ŷ = argmax(q_j / E)
all at counter = the row's decode position when the block starts (the number of tokens it has
emitted). Every verify step emits at least one token, so a row never reuses a (stream, counter).

Deviations from the textbook algorithm, shared by both verifiers (each module lists its own):
    1) One Exp(1) vector per row serves the single categorical draw of a verify step (recovered at
       the stop position, or bonus), not one per position. Exact: the stop position is a function
       of the coins and drafts only, so the vector is fresh Exp(1) noise for whichever row of p is
       chosen. It saves K of K+1 vocabulary-sized noise vectors.
    2) Categorical draws use the exponential race argmax(w / E), E ~ Exp(1) i.i.d. (equivalently
       Gumbel-max): exact for any non-negative weights, needs no normalisation and no host sync.
       SGLang inverts the CDF; vLLM uses Gumbel-max on logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from bebop.speculative import rng
from bebop.speculative.block import accept_block
from bebop.speculative.sampling import (
    PAD_TOKEN_ID,
    accept_token_wise,
    drafts_with_bonus,
    keyed_race,
    sample_from_probs,
)
from bebop.utils.torch_utils import compute_dtype

PROB_SUM_TOLERANCE = 1e-3  # |Σ p - 1| allowed: float32 softmax over 256k tokens errs by ~1e-5;
# a larger error means unnormalised weights were passed, which would break exactness silently.
STREAM_ACCEPT = 0  # rng stream of the accept coins, (B, K) uniforms per verify step
STREAM_RESAMPLE = 1  # rng stream of the recovered/bonus draw, one (B, V) Exp(1) vector per verify step
STREAM_DRAFT = 2  # draft step j (0-based) of a block uses rng stream STREAM_DRAFT + j
COIN_DTYPE = torch.float64  # accept coins on a 2^-53 grid: P(u < a) = a to 1e-16, and (B, K) is tiny

# (target_probs (B, K+1, V), draft_tokens (B, K), draft_probs (B, K, V) | None, uniform (B, K))
#   -> (num_accepted (B,) int64, weights of the emitted token (B, V))
Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor],
                    tuple[torch.Tensor, torch.Tensor]]
VERIFIERS: dict[str, Verifier] = {  # SpecConfig.verify -> its verifier (bebop.speculative.settings.VERIFY_CHOICES)
    "token": accept_token_wise,  # token-wise rejection sampling; target-only when draft_probs is None
    "block": accept_block,  # block verification (Sun et al. 2025); needs draft_probs
}


# ----------------------------------------------------------------------------- input checks


def _check_probs_shape(x: torch.Tensor, name: str, shape: tuple[int, ...]) -> None:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got {getattr(x, 'dtype', type(x))}")
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {shape}, got {tuple(x.shape)}")


def _check_shapes(
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
    sums = x.to(compute_dtype(x)).sum(-1)
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


# ----------------------------------------------------------------------------- noise


def noise_keys(
    seeds: torch.Tensor,  # (B,) int64, from rng.derive_seeds
    max_k: int,  # the deepest K any step of the call drafts
) -> torch.Tensor:  # (B, 2 + max_k) int64
    """The rows' stream keys (`rng.stream_keys`), derived once per generate call: column 0 the accept
    coins, column 1 the recovered/bonus draw, column 2 + j draft step j."""
    return rng.stream_keys(seeds, [STREAM_ACCEPT, STREAM_RESAMPLE] + [STREAM_DRAFT + j for j in range(max_k)])


def race_key(
    keys: torch.Tensor,  # (B, 2 + max_k) int64, from noise_keys
    counters: torch.Tensor,  # (B,) int64, the rows' decode positions
) -> torch.Tensor:  # (B,) int64
    """The key of the emitted token's race (stream STREAM_RESAMPLE) at the rows' counters, for `sampling.keyed_race`."""
    return rng.counter_keys(keys[:, STREAM_RESAMPLE: STREAM_RESAMPLE + 1], counters)[:, 0]


def draw_coins(
    keys: torch.Tensor,  # (B, 2 + max_k) int64, from noise_keys
    counters: torch.Tensor,  # (B,) int64, the rows' decode positions
    k: int,  # coins per row: K for one chain
) -> torch.Tensor:  # (B, K) float64 in (0, 1)
    """The accept coins of one verify step (stream STREAM_ACCEPT), batch-independent."""
    return rng.uniform_from_bits(rng.keyed_bits(keys[:, STREAM_ACCEPT: STREAM_ACCEPT + 1], counters, (k,))[:, 0],
                                 COIN_DTYPE)


# ----------------------------------------------------------------------------- verify ops


def verify_from_noise(
    verifier: Verifier,
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None,  # (B, K, V); None = target-only
    uniform: torch.Tensor,  # (B, K) in (0, 1): accept coins
    exponential: torch.Tensor,  # (B, V) Exp(1) > 0: the recovered/bonus draw
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """Verify drafts with `verifier`, deterministically given the noise.

    Args:
        verifier: a `VERIFIERS` value.
        target_probs: p at each draft position and the bonus position, after the user's
            temperature/top-k/top-p: the output follows exactly this.
        draft_tokens: ŷ; with draft_probs, each ŷ_j must have been drawn from draft_probs[:, j].
        draft_probs: q, exactly the distribution ŷ was drawn from; None = target-only (token-wise only).
        uniform, exponential: the noise: one coin per draft (the verifier says how it decides), and
            the race of the emitted token.
        validate: check values too (NaN, negatives, sums, token range, noise range) at the cost
            of one host sync; shapes and dtypes are always checked.

    Returns:
        output_tokens: (B, K+1) accepted drafts, then the recovered or bonus token, then PAD_TOKEN_ID.
        num_accepted: (B,) in 0..K; the row emitted num_accepted + 1 tokens.
    """
    batch, k, vocab = _check_shapes(target_probs, draft_tokens, draft_probs)
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
    return _verify(verifier, target_probs, draft_tokens, draft_probs, uniform,
                   lambda weights: sample_from_probs(weights, exponential.to(weights.dtype)))


def verify_keyed(
    verifier: Verifier,
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None,  # (B, K, V); None = target-only
    keys: torch.Tensor,  # (B, 2 + max_k) int64, from noise_keys
    counters: torch.Tensor,  # (B,) int64, the rows' decode positions
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """The engine's verify step: `verify_from_noise` with the rows' keyed noise (`draw_coins`, and the
    STREAM_RESAMPLE race by `sampling.keyed_race`), token for token, without a (B, V) noise tensor. The
    inputs are not checked: the engine made them."""
    return _verify(verifier, target_probs, draft_tokens, draft_probs, draw_coins(keys, counters, draft_tokens.shape[1]),
                   lambda weights: keyed_race(weights, race_key(keys, counters)))


def _verify(verifier, target_probs, draft_tokens, draft_probs, uniform, race):
    """The verifier's count and weights, the emitted token drawn by ``race(weights)`` (B,), the output laid out."""
    num_accepted, weights = verifier(target_probs, draft_tokens, draft_probs, uniform)  # (B,), (B, V)
    return output_tokens(draft_tokens, num_accepted, race(weights)), num_accepted


def output_tokens(
    draft_tokens: torch.Tensor,  # (B, K) int64
    num_accepted: torch.Tensor,  # (B,) int64 in 0..K
    emitted: torch.Tensor,  # (B,) int64, the recovered or bonus token
) -> torch.Tensor:  # (B, K+1) int64
    """A verify step's output per row: the accepted drafts, the emitted token, then PAD_TOKEN_ID.

    Example: drafts [[5, 8]], 1 accepted, emitted 3 -> [[5, 3, -1]].
    """
    positions = torch.arange(draft_tokens.shape[1] + 1, device=draft_tokens.device)  # (K+1,)
    stop = num_accepted[:, None]  # (B, 1)
    output = torch.where(positions < stop, drafts_with_bonus(draft_tokens), PAD_TOKEN_ID)
    return torch.where(positions == stop, emitted[:, None], output)


def _verify_with_generator(
    verifier: Verifier,
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None,  # (B, K, V)
    generator: torch.Generator | None,
    validate: bool,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    batch, k, vocab = _check_shapes(target_probs, draft_tokens, draft_probs)
    device = target_probs.device
    # Draw bits and map them like bebop.speculative.rng does, so both noise sources share one format.
    coin_bits = torch.randint(0, 1 << 52, (batch, k), generator=generator, device=device)
    race_bits = torch.randint(0, 1 << 52, (batch, vocab), generator=generator, device=device)
    coins = rng.uniform_from_bits(coin_bits, COIN_DTYPE)
    race = rng.exponential_from_bits(race_bits)
    return verify_from_noise(verifier, target_probs, draft_tokens, draft_probs, coins, race, validate=validate)


def rejection_sample(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor | None = None,  # (B, K, V); None = target-only
    generator: torch.Generator | None = None,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """Rejection sampling (draft_probs given) or target-only verification, noise from `generator`.

    The noise is drawn in call order, so a row's tokens depend on the batch it is in (the engine's
    `verify_keyed` does not). generator=None uses torch's default generator. Args and returns
    as in `verify_from_noise`.
    """
    return _verify_with_generator(accept_token_wise, target_probs, draft_tokens, draft_probs, generator, validate)


def block_verify(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor,  # (B, K, V)
    generator: torch.Generator | None = None,
    *,
    validate: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) int64, (B,) int64
    """Block verification (`bebop.speculative.block`), noise from `generator` as in `rejection_sample`."""
    return _verify_with_generator(accept_block, target_probs, draft_tokens, draft_probs, generator, validate)


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
    batch, k, vocab = _check_shapes(target_logits_or_probs, draft_tokens, None, name="target_logits_or_probs")
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
