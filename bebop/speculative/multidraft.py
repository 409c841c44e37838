"""Multi-draft verification: n drafted chains per row that share the row's prefix, verified losslessly.

Terms (p is the target's distribution, q the draft's; `bebop.speculative.verification` defines draft,
accepted, recovered, bonus token and accept length):
    chain           one drafted continuation of K tokens. A row drafts n chains: their first tokens
                    x_1..x_n are drawn i.i.d. from the head's depth-1 distribution q_1, and chain c
                    continues from x_c to depth K as a single chain does.
    round           one of the n tries at depth 1. Round i tests x_i against the residual r_{i-1}:
                    r_0 = p_1, r_i = norm(max(0, r_{i-1} - q_1)). x_i is accepted with probability
                    min(1, r_{i-1}(x_i) / q_1(x_i)); the first accepted round picks its chain.
    final residual  r_n, the distribution the recovered token is drawn from when all n rounds reject.

The depth-1 rule is multi-round speculative sampling for i.i.d. drafts (Miao et al. 2024, SpecInfer,
"multi-step speculative sampling"; Yang et al. 2024, "Multi-Candidate Speculative Decoding"). It is
exact by induction on the rounds: rejection sampling of target r_{i-1} from proposal q_1 emits either
x_i (accepted) or a draw from r_i; drawing that from rounds i+1..n emits r_i exactly, because x_{i+1}
is a fresh draw from q_1, independent of rounds 1..i. After a chain is picked its later drafts were
drawn from q(·| x_c) independently of the rounds, so token-wise rejection sampling along the picked
chain (`sampling.accept_token_wise`) keeps the output exact at depths 2..K+1.

Acceptance at depth 1 is 1 - Π_{i=1..n} (1 - Σ_v min(q_1(v), r_{i-1}(v))) (`multi_draft_accept_prob`);
with n = 1 it is the chain's α_RS = Σ min(p, q), and it never falls as n grows.

Deviations from the textbook algorithm:
    1) Coins: the depth-1 rounds use uniform[:, :n], the picked chain's later drafts uniform[:, n:].
       With n = 1 the layout, the accept tests and the emitted weights are the token-wise verifier's
       exactly, so one chain verified here equals `accept_token_wise` bit for bit.
    2) A residual that is all zero falls back to the previous one (as `sampling.recovery_weights`
       falls back to p): r_{i-1} <= q_1 everywhere means r_{i-1} = q_1, round i accepts with
       probability 1, and the fallback is reached only through float rounding.
    3) The recovered token after n rejections is drawn from the unnormalised max(0, r_{n-1} - q_1)
       (the exponential race needs no normalisation); the rounds test against normalised residuals.
"""

from __future__ import annotations

import torch

from bebop.speculative import rng
from bebop.speculative.sampling import (
    accept_token_wise,
    acceptance_probs,
    compute_dtype,
    keyed_race,
    recovery_weights,
    sample_from_probs,
)
from bebop.speculative.verification import COIN_DTYPE, STREAM_DRAFT, draw_coins, output_tokens, race_key


def _check(
    target_probs: torch.Tensor,  # (B, n, K+1, V)
    draft_tokens: torch.Tensor,  # (B, n, K) int64
    draft_probs: torch.Tensor,  # (B, n, K, V)
    uniform: torch.Tensor | None = None,  # (B, n + K - 1)
) -> tuple[int, int, int, int]:
    if target_probs.dim() != 4 or target_probs.shape[2] < 2:
        raise ValueError(f"target_probs must be (B, n, K+1, V) with K >= 1, got {tuple(target_probs.shape)}")
    batch, num_drafts, k_plus_1, vocab = target_probs.shape
    k = k_plus_1 - 1
    if num_drafts < 1:
        raise ValueError("multi-draft verification needs at least one draft per row")
    if draft_tokens.dtype != torch.int64 or tuple(draft_tokens.shape) != (batch, num_drafts, k):
        raise ValueError(f"draft_tokens must be int64 (B, n, K) = {(batch, num_drafts, k)}, "
                         f"got {draft_tokens.dtype} {tuple(draft_tokens.shape)}")
    if draft_probs is None or tuple(draft_probs.shape) != (batch, num_drafts, k, vocab):
        raise ValueError(f"draft_probs must be (B, n, K, V) = {(batch, num_drafts, k, vocab)}: multi-draft "
                         f"verification needs the draft's distribution (it has no target-only form)")
    if uniform is not None and tuple(uniform.shape) != (batch, num_drafts + k - 1):
        raise ValueError(f"uniform must be (B, n + K - 1) = {(batch, num_drafts + k - 1)}, got {tuple(uniform.shape)}")
    return batch, num_drafts, k, vocab


def residuals(
    p: torch.Tensor,  # (..., V) the target at depth 1
    q: torch.Tensor,  # (..., V) the draft at depth 1
    num_rounds: int,
) -> tuple[torch.Tensor, torch.Tensor]:  # (..., n, V), (..., V)
    """The targets of rounds 1..n (r_0 = p, r_i = norm(max(0, r_{i-1} - q))) and the unnormalised
    weights of the token recovered after all n reject (deviations 2 and 3).

    Example: p = [0.2, 0.8], q = [0.5, 0.5], n = 2 -> rounds [[0.2, 0.8], [0, 1]], final weights [0, 0.5].
    """
    dtype = compute_dtype(p, q)
    r, q = p.to(dtype), q.to(dtype)
    not_pad = torch.zeros(p.shape[:-1], dtype=torch.int64, device=p.device)  # any token: the residual branch
    rounds = []
    for _ in range(num_rounds):
        rounds.append(r)
        weights = recovery_weights(r, not_pad, q)  # max(0, r - q), r itself where that is all zero
        r = weights / weights.sum(-1, keepdim=True)
    return torch.stack(rounds, dim=-2), weights


def accept_multi_draft(
    target_probs: torch.Tensor,  # (B, n, K+1, V) p along each chain; [:, c, 0] is the same row for every c
    draft_tokens: torch.Tensor,  # (B, n, K) int64, [:, :, 0] drawn i.i.d. from q_1
    draft_probs: torch.Tensor,  # (B, n, K, V) q along each chain; [:, c, 0] is the same row for every c
    uniform: torch.Tensor,  # (B, n + K - 1) in (0, 1): n depth-1 coins, then the picked chain's K - 1
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (B,) int64, (B,) int64, (B, V)
    """Which chain each row keeps, how many of its drafts it accepts, and the weights of the token it
    emits next (draw it with `sampling.sample_from_probs`).

    Rounds 1..n test the chains' first tokens against the residuals in order; the first acceptance
    picks its chain, then its later drafts are verified token-wise. A row whose n rounds all reject
    keeps chain 0, accepts nothing and emits from the final residual.

    Example (n = 2, K = 1): p_1 = [0.2, 0.8], q_1 = [0.5, 0.5], drafts x = [0, 0], coins [0.5, 0.1]:
    round 1 accepts token 0 with probability 0.4 and the coin rejects; round 2's target is [0, 1], so
    token 0 is rejected again; the row emits from [0, 0.5], token 1, with 0 drafts accepted.
    """
    batch, num_drafts, k, vocab = _check(target_probs, draft_tokens, draft_probs, uniform)
    p_1, q_1 = target_probs[:, 0, 0], draft_probs[:, 0, 0]  # (B, V)
    rounds, final_weights = residuals(p_1, q_1, num_drafts)  # (B, n, V), (B, V)
    round_accept = acceptance_probs(rounds, draft_tokens[:, :, 0], q_1[:, None].expand(batch, num_drafts, vocab))
    accepted = uniform[:, :num_drafts] < round_accept  # (B, n)
    any_accepted = accepted.any(dim=1)  # (B,)
    chain = accepted.long().argmax(dim=1)  # (B,) the first accepted round; 0 where none is
    rows = torch.arange(batch, device=target_probs.device)
    deeper, weights = accept_token_wise(
        target_probs[rows, chain, 1:], draft_tokens[rows, chain, 1:], draft_probs[rows, chain, 1:], uniform[:, num_drafts:]
    )
    num_accepted = torch.where(any_accepted, 1 + deeper, 0)
    weights = torch.where(any_accepted[:, None], weights.to(final_weights.dtype), final_weights)
    return chain, num_accepted, weights


def multi_draft_accept_prob(
    p: torch.Tensor,  # (..., V) the target at depth 1
    q: torch.Tensor,  # (..., V) the draft at depth 1
    num_drafts: int,
) -> torch.Tensor:  # (...) in [0, 1]
    """Exact probability that one of n i.i.d. drafts from q is accepted at depth 1:
    1 - Π_{i=1..n} (1 - Σ_v min(q(v), r_{i-1}(v))). n = 1 gives α_RS = Σ min(p, q).

    Example: p = [0.2, 0.8], q = [0.5, 0.5]: n = 1 -> 0.7; n = 2 -> 1 - 0.3 · (1 - 0.5) = 0.85.
    """
    if num_drafts < 1:
        raise ValueError(f"num_drafts must be >= 1, got {num_drafts}")
    rounds, _ = residuals(p, q, num_drafts)  # (..., n, V)
    round_accept = torch.minimum(rounds, q.to(rounds.dtype)[..., None, :]).sum(-1).clamp(0.0, 1.0)  # (..., n)
    return 1 - (1 - round_accept).prod(dim=-1)


def verify_multi_draft_from_noise(
    target_probs: torch.Tensor,  # (B, n, K+1, V)
    draft_tokens: torch.Tensor,  # (B, n, K) int64
    draft_probs: torch.Tensor,  # (B, n, K, V)
    uniform: torch.Tensor,  # (B, n + K - 1) in (0, 1)
    exponential: torch.Tensor,  # (B, V) Exp(1) > 0: the recovered/bonus draw
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (B,) int64, (B, K+1) int64, (B,) int64
    """One multi-draft verify step, deterministically given the noise: the kept chain, the output laid
    out as `verification.verify_from_noise` lays it out (the kept chain's accepted drafts, the emitted
    token, then PAD_TOKEN_ID), and the accepted count."""
    return _verify_multi_draft(target_probs, draft_tokens, draft_probs, uniform,
                               lambda weights: sample_from_probs(weights, exponential.to(weights.dtype)))


def verify_multi_draft_keyed(
    target_probs: torch.Tensor,  # (B, n, K+1, V)
    draft_tokens: torch.Tensor,  # (B, n, K) int64
    draft_probs: torch.Tensor,  # (B, n, K, V)
    keys: torch.Tensor,  # (B, 2 + max_k) int64, the rows' stream keys (``verification.noise_keys``)
    counters: torch.Tensor,  # (B,) int64, the rows' decode positions
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (B,) int64, (B, K+1) int64, (B,) int64
    """The engine's multi-draft verify step: `verify_multi_draft_from_noise` with the rows' keyed noise
    (n + K - 1 coins, the emitted token's race by `sampling.keyed_race`), token for token."""
    num_drafts, k = draft_tokens.shape[1:]
    return _verify_multi_draft(target_probs, draft_tokens, draft_probs, draw_coins(keys, counters, num_drafts + k - 1),
                               lambda weights: keyed_race(weights, race_key(keys, counters)))


def _verify_multi_draft(target_probs, draft_tokens, draft_probs, uniform, race):
    """`accept_multi_draft`, the emitted token drawn by ``race(weights)`` (B,), the kept chain's output laid out."""
    chain, num_accepted, weights = accept_multi_draft(target_probs, draft_tokens, draft_probs, uniform)
    kept = draft_tokens[torch.arange(chain.shape[0], device=chain.device), chain]  # (B, K)
    return chain, output_tokens(kept, num_accepted, race(weights)), num_accepted


def multi_draft_verify(
    target_probs: torch.Tensor,  # (B, n, K+1, V)
    draft_tokens: torch.Tensor,  # (B, n, K) int64
    draft_probs: torch.Tensor,  # (B, n, K, V)
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:  # (B,) int64, (B, K+1) int64, (B,) int64
    """`verify_multi_draft_from_noise` with its noise drawn from `generator` in call order (the format
    of `bebop.speculative.rng`, as `verification.rejection_sample` draws it)."""
    batch, num_drafts, k, vocab = _check(target_probs, draft_tokens, draft_probs)
    device = target_probs.device
    coin_bits = torch.randint(0, 1 << 52, (batch, num_drafts + k - 1), generator=generator, device=device)
    race_bits = torch.randint(0, 1 << 52, (batch, vocab), generator=generator, device=device)
    coins, race = rng.uniform_from_bits(coin_bits, COIN_DTYPE), rng.exponential_from_bits(race_bits)
    return verify_multi_draft_from_noise(target_probs, draft_tokens, draft_probs, coins, race)


def multi_draft_expected_accepts(
    p_1: torch.Tensor,  # (N, V) the target at depth 1 of each chain
    q_1: torch.Tensor,  # (N, V) the draft at depth 1
    alpha: torch.Tensor,  # (N, K) the chain's token-wise acceptance α_RS,j (only j >= 2 is read)
    num_drafts: int,
) -> torch.Tensor:  # (N,) expected accepted drafts per verify step
    """E[accepted drafts] of a verify step with n chains: the depth-1 acceptance of n drafts, then the
    kept chain's token-wise acceptances, E = a_n · (1 + Σ_{j>=2} Π_{i=2..j} α_i). Depths >= 2 use the
    chain's α as `bebop.mtp.evaluate` does (the accepted depth-1 token is distributed as p_1 whatever n
    is, so the kept chain continues as one chain would). n = 1 gives the chain's Σ_j Π_{i<=j} α_i.

    Example: a_2 = 0.85 (p = [0.2, 0.8], q = [0.5, 0.5]) and α_2 = 0.5 -> 0.85 · 1.5 = 1.275.
    """
    deeper = alpha[:, 1:].to(torch.float64).cumprod(dim=1).sum(dim=1)  # (N,)
    return multi_draft_accept_prob(p_1, q_1, num_drafts).to(torch.float64) * (1 + deeper)


def lane_keys(
    keys: torch.Tensor,  # (R, 2 + max_k) int64, the rows' stream keys (``verification.noise_keys``)
    counters: torch.Tensor,  # (R,) int64, the rows' decode positions at the start of the block
    k: int,
    num_drafts: int,
) -> torch.Tensor:  # (R, n, K) int64
    """The draft streams' keys of n chains at the rows' counters: lane 0 is one chain's (stream STREAM_DRAFT + j),
    lane c > 0 the stream keyed by (the row's draft key of step j, c), a pure function of the row's seed like
    every stream, so a row's drafts do not depend on its batch. Draft j of lane c is
    ``sampling.keyed_race(q, lane_keys[:, c, j])``."""
    lanes = [keys[:, STREAM_DRAFT: STREAM_DRAFT + k]]  # (R, K)
    for c in range(1, num_drafts):
        lanes.append(torch.stack([rng.stream_keys(keys[:, STREAM_DRAFT + j], [c])[:, 0] for j in range(k)], dim=1))
    stream = torch.stack(lanes, dim=1)  # (R, n, K)
    return rng.counter_keys(stream.reshape(stream.shape[0], -1), counters).view(stream.shape)
