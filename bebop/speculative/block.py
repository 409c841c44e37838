"""Block verification: the drafted chain is accepted jointly, not token by token.

Sun et al., "Block Verification Accelerates Speculative Decoding" (arXiv 2403.10444, ICLR 2025).
`accept_block` is the "block" entry of `bebop.speculative.verification.VERIFIERS`: the same inputs,
noise and outputs as token-wise verification (`verification` checks the inputs, draws the noise and
assembles the output for both); exactly lossless too, and never fewer accepted drafts in expectation
with the same drafts.

Terms (p_j is the target's distribution at draft position j, q_j the draft's; ŷ_j ~ q_j; j = 1..K,
p_{K+1} the bonus row; `bebop.speculative.verification` defines draft, accepted, recovered, bonus):
    ratio           r_j = p_j(ŷ_j) / q_j(ŷ_j).
    prefix weight   w_0 = 1, w_j = min(1, w_{j-1} · r_j): the probability that the accepted prefix
                    reaches ŷ_1..ŷ_j given those drafts (NOTE: P(stop >= j | ŷ_1..ŷ_j) = w_j is the
                    invariant the rest is built on). Token-wise verification has Π_i min(1, r_i) <= w_j.
    block residual  the weights max(0, w_j · p_{j+1} - q_{j+1}) of the token emitted after stopping at
                    j < K, with mass m_j = Σ_v max(0, w_j · p_{j+1}(v) - q_{j+1}(v)). Token-wise
                    recovery is the case w_j = 1.
    stop threshold  h_j = m_j / (m_j + 1 - w_j) for 1 <= j < K, h_K = w_K, h_0 = 1.
    stop            τ = the largest j in 0..K with u_j < h_j (one coin u_j per j = 1..K): the row
                    accepts ŷ_1..ŷ_τ, then emits one token from the block residual at τ (τ < K) or from
                    p_{K+1} (τ = K, the bonus token).

Why it is exact (the docs/block.md argument, in three lines). By backward induction on j, with
P(τ > j | ŷ_1..ŷ_j) = Σ_v q_{j+1}(v) min(1, w_j r_{j+1}(v)) = w_j - m_j, the threshold h_j makes
P(τ >= j | ŷ_1..ŷ_j) = w_j. Then P(τ = j, ŷ_1..ŷ_j, next = y) = q(ŷ_1..ŷ_j) max(0, w_j p_{j+1}(y) -
q_{j+1}(y)), and adding the chains that accept y as a draft, q(ŷ_1..ŷ_j) min(q_{j+1}(y), w_j p_{j+1}(y)),
gives q(ŷ_1..ŷ_j) w_j p_{j+1}(y): by induction on j every emitted prefix (continued by plain target
sampling after the stop) has exactly the target's probability.

Deviations from the paper's pseudo-code:
    1) The coins are compared as u_j < h_j (the paper writes η <= h): the same event up to the 2^-53
       grid of the float64 coins, and the token-wise verifier's convention.
    2) h_j = 0 when its denominator m_j + 1 - w_j is 0 (w_j = 1 and p_{j+1} <= q_{j+1}, so p_{j+1} =
       q_{j+1}): then P(τ > j | ŷ_1..ŷ_j) = 1, so u_j never decides τ and any value is exact.
    3) If q_j(ŷ_j) = 0 (a sampled draft cannot have it) w_j = 1 when w_{j-1} > 0 and p_j(ŷ_j) > 0,
       else 0, the limit of min(1, w_{j-1} p/q); never a NaN. An all-zero residual (reached with
       probability 0) falls back to p_{j+1}, as `sampling.recovery_weights` does.
    4) Target-only (q one-hot) is not offered: block verification here needs the draft's q.
"""

from __future__ import annotations

import torch

from bebop.speculative.sampling import stop_rows
from bebop.utils.torch_utils import compute_dtype

WEIGHT_DTYPE = torch.float64  # w_j and h_j: products of K ratios, compared with the float64 accept coins


def _require_draft_probs(draft_probs: torch.Tensor | None) -> None:
    if draft_probs is None:
        raise ValueError("block verification needs draft_probs: the q every draft was drawn from")


def prefix_weights(
    target_probs: torch.Tensor,  # (B, K+1, V) or (B, K, V); only the first K rows are read
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor,  # (B, K, V)
) -> torch.Tensor:  # (B, K+1) float64, w_0 = 1 .. w_K
    """w_j = min(1, w_{j-1} · p_j(ŷ_j) / q_j(ŷ_j)), w_0 = 1 (deviation 3 when q_j(ŷ_j) = 0).

    Example: ratios [0.5, 4.0, 0.5] -> w = [1, 0.5, 1, 0.5]; token-wise: [1, 0.5, 0.5, 0.25].
    """
    k = draft_tokens.shape[1]
    index = draft_tokens[..., None]  # (B, K, 1)
    p_draft = target_probs[:, :k].gather(-1, index).squeeze(-1).to(WEIGHT_DTYPE)  # (B, K)
    q_draft = draft_probs.gather(-1, index).squeeze(-1).to(WEIGHT_DTYPE)  # (B, K)
    weights = [p_draft.new_ones(p_draft.shape[0])]  # w_0 = 1 (K = 0 included)
    for j in range(k):  # K is small; no host sync
        prev, p, q = weights[-1], p_draft[:, j], q_draft[:, j]
        # NOTE: (prev * p) / q, not prev * (p / q): prev = 0 must stay 0 even when p / q overflows.
        ratio = (prev * p) / torch.where(q > 0, q, 1.0)
        weights.append(torch.where(q > 0, ratio, ((prev > 0) & (p > 0)).to(ratio.dtype)).clamp(max=1.0))
    return torch.stack(weights, dim=1)


def block_residual(
    target_probs: torch.Tensor,  # (..., V) p_{j+1}
    draft_probs: torch.Tensor,  # (..., V) q_{j+1}
    weight: torch.Tensor,  # (...) w_j
) -> torch.Tensor:  # (..., V) max(0, w_j · p_{j+1} - q_{j+1}), unnormalised
    """The block residual weights after stopping at j < K; w_j = 1 gives token-wise recovery.

    Example: p = [0.2, 0.8], q = [0.5, 0.5], w = 0.5 -> [0, 0]; w = 1 -> [0, 0.3].
    """
    dtype = compute_dtype(target_probs, draft_probs)
    scaled = weight[..., None].to(dtype) * target_probs.to(dtype)
    return (scaled - draft_probs.to(dtype)).clamp_min(0.0)


def stop_thresholds(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor,  # (B, K, V)
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1) float64, (B, K+1) float64
    """(h, w): the stop thresholds h_0 = 1, h_1..h_K and the prefix weights w_0..w_K."""
    k = draft_tokens.shape[1]
    weights = prefix_weights(target_probs, draft_tokens, draft_probs)  # (B, K+1)
    # m_j for j = 0..K-1: the mass of the residual after stopping at j (p_{j+1}, q_{j+1}).
    mass = block_residual(target_probs[:, :k], draft_probs, weights[:, :k]).sum(-1).to(WEIGHT_DTYPE)  # (B, K)
    denominator = mass + 1.0 - weights[:, :k]
    inner = torch.where(denominator > 0, mass / torch.where(denominator > 0, denominator, 1.0), 0.0)
    thresholds = torch.cat([inner, weights[:, k:]], dim=1)  # (B, K+1): index j = h_j for j = 0..K
    thresholds[:, 0] = 1.0  # h_0: the empty prefix is always accepted
    return thresholds.clamp(0.0, 1.0), weights


def block_distributions(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor,  # (B, K, V)
) -> tuple[torch.Tensor, torch.Tensor]:  # (B, K+1), (B, K+1, V)
    """The whole block verify step in closed form, for tests and analysis (inputs are not checked).

    Returns:
        stop: (B, K+1) P(τ = j | drafts) = h_j Π_{i>j} (1 - h_i), summing to 1 over j.
        resample: (B, K+1, V) the normalised distribution of the token emitted after stopping at j.
    `accept_block` uses the same `stop_thresholds` and `block_residual`.
    """
    _require_draft_probs(draft_probs)
    k = draft_tokens.shape[1]
    thresholds, weights = stop_thresholds(target_probs, draft_tokens, draft_probs)
    later_fail = torch.flip(torch.cumprod(torch.flip(1.0 - thresholds, [1]), 1), [1])  # (B, K+1): Π_{i>=j}
    later_fail = torch.cat([later_fail[:, 1:], torch.ones_like(later_fail[:, :1])], dim=1)  # Π_{i>j}
    stop = thresholds * later_fail
    rows = [_emission_weights(target_probs[:, j], draft_probs[:, j] if j < k else None, weights[:, j])
            for j in range(k + 1)]
    resample = torch.stack(rows, dim=1)
    return stop, resample / resample.sum(-1, keepdim=True)


def _emission_weights(
    target_row: torch.Tensor,  # (B, V) p_{τ+1}
    draft_row: torch.Tensor | None,  # (B, V) q_{τ+1}; None at the bonus position
    weight: torch.Tensor,  # (B,) w_τ
    is_bonus: torch.Tensor | None = None,  # (B,) bool: rows whose τ = K (then draft_row is ignored)
) -> torch.Tensor:  # (B, V) non-negative, never all zero for a valid p
    """Weights of the emitted token: the block residual, p_{K+1} at the bonus, p if the residual is empty."""
    p = target_row.to(compute_dtype(target_row, draft_row))
    if draft_row is None:
        return p
    weights = block_residual(p, draft_row, weight)
    if is_bonus is not None:
        weights = torch.where(is_bonus[:, None], p, weights)
    return torch.where(weights.sum(-1, keepdim=True) <= 0, p, weights)


def accept_block(
    target_probs: torch.Tensor,  # (B, K+1, V)
    draft_tokens: torch.Tensor,  # (B, K) int64
    draft_probs: torch.Tensor,  # (B, K, V)
    uniform: torch.Tensor,  # (B, K) in (0, 1): coin j-1 decides h_j
) -> tuple[torch.Tensor, torch.Tensor]:  # (B,) int64, (B, V)
    """τ, the drafts each row accepts, and the weights of the token it emits next.

    The row stops at the largest j with uniform[:, j-1] < h_j (τ = 0 if none) and emits from the
    block residual at τ, or from p_{K+1} at τ = K (`_emission_weights`). `verification.verify_from_noise`
    checks the inputs and draws the token.

    Example: h_1, h_2 = [0.5, 0.2]: coins [0.9, 0.1] stop at τ = 2 (the bonus); coins [0.4, 0.3] at τ = 1.
    """
    _require_draft_probs(draft_probs)
    batch, k = draft_tokens.shape
    thresholds, weights = stop_thresholds(target_probs, draft_tokens, draft_probs)  # (B, K+1) each
    depth = torch.arange(1, k + 1, device=target_probs.device)  # (K,)
    passed = uniform.to(WEIGHT_DTYPE) < thresholds[:, 1:]  # (B, K)
    num_accepted = torch.where(passed, depth, 0).amax(dim=1) if k else depth.new_zeros(batch)  # (B,) τ
    p_stop, q_stop = stop_rows(target_probs, draft_probs, num_accepted)
    rows = torch.arange(batch, device=target_probs.device)
    return num_accepted, _emission_weights(p_stop, q_stop, weights[rows, num_accepted], is_bonus=num_accepted == k)


# ----------------------------------------------------------------------------- expected accepts

EXACT_MAX_ATOMS = 1 << 17  # V^(K-1) prefix-weight values per chain above which the expectation is sampled
ATOMS_PER_CHUNK = 1 << 22  # chains x atoms held at once by `expected_block_accepts`
MC_DRAWS = 256  # draft chains drawn per teacher-forced chain when the exact sum is too large


def expected_block_accepts(
    target_probs: torch.Tensor,  # (N, K, V) p_1..p_K of N chains, fixed along each chain
    draft_probs: torch.Tensor,  # (N, K, V) q_1..q_K
) -> torch.Tensor:  # (N,) float64
    """E[τ], the expected accepted drafts of block verification, exactly, when p_j and q_j do not depend
    on the earlier drafts (the teacher-forced chains of `bebop.mtp.evaluate`, where token-wise gives
    Σ_j Π_{i<=j} α_i).

    E[τ] = Σ_j P(τ >= j) = Σ_j E[w_j] over ŷ_j ~ q_j, by the invariant P(τ >= j | ŷ_1..ŷ_j) = w_j. The
    values of w_{K-1} (V^(K-1) atoms) are enumerated; the last step sums E[min(1, w r)] over the sorted
    atoms. Raises ValueError past EXACT_MAX_ATOMS atoms (use `sampled_block_accepts`).

    Example: p = [1/3, 2/3], q = [2/3, 1/3] at K = 2 (Sun et al.'s example) -> 11/9; token-wise 10/9.
    """
    num, k, vocab = target_probs.shape
    if vocab ** max(k - 1, 0) > EXACT_MAX_ATOMS:
        raise ValueError(f"V^(K-1) = {vocab}^{k - 1} atoms exceed {EXACT_MAX_ATOMS}; use sampled_block_accepts")
    chunk = max(1, ATOMS_PER_CHUNK // (vocab ** max(k - 1, 0) * vocab))
    return torch.cat([_exact_chunk(target_probs[i: i + chunk].double(), draft_probs[i: i + chunk].double())
                      for i in range(0, num, chunk)]) if num else target_probs.new_zeros(0, dtype=torch.float64)


def _exact_chunk(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:  # (n, K, V) each -> (n,)
    n, k, _ = p.shape
    ratio = torch.where(q > 0, p / torch.where(q > 0, q, 1.0), 0.0)  # (n, K, V); q = 0 is never drafted
    values = p.new_ones(n, 1)  # (n, A) atoms of w_j
    probs = p.new_ones(n, 1)  # (n, A) their probabilities
    total = p.new_zeros(n)
    for j in range(k - 1):
        values = (values[:, :, None] * ratio[:, None, j]).clamp(max=1.0).reshape(n, -1)
        probs = (probs[:, :, None] * q[:, None, j]).reshape(n, -1)
        total += (values * probs).sum(1)
    # Last step: E[min(1, w r)] = P(w >= 1/r) + r E[w; w < 1/r], from prefix sums over the sorted atoms.
    values, order = values.sort(dim=1)
    probs = probs.gather(1, order)
    zero = p.new_zeros(n, 1)
    mass_below = torch.cat([zero, probs.cumsum(1)], 1)  # (n, A+1)
    weight_below = torch.cat([zero, (probs * values).cumsum(1)], 1)  # (n, A+1)
    r = ratio[:, k - 1]  # (n, V)
    threshold = torch.where(r > 0, 1.0 / torch.where(r > 0, r, 1.0), float("inf"))
    below = torch.searchsorted(values.contiguous(), threshold.contiguous())  # (n, V): atoms with w < 1/r
    last = (mass_below[:, -1:] - mass_below.gather(1, below)) + r * weight_below.gather(1, below)
    return total + (q[:, k - 1] * last).sum(1)


def sampled_block_accepts(
    target_probs: torch.Tensor,  # (N, K, V) as for expected_block_accepts
    draft_probs: torch.Tensor,  # (N, K, V)
    generator: torch.Generator,
    num_draws: int = MC_DRAWS,
) -> tuple[torch.Tensor, torch.Tensor]:  # (N,), (N,) float64
    """Monte Carlo E[τ] (mean of Σ_j w_j over `num_draws` draft chains ŷ_j ~ q_j) and the variance of that mean."""
    num, k, vocab = target_probs.shape
    drafts = torch.multinomial(draft_probs.reshape(-1, vocab).double(), num_draws, replacement=True,
                               generator=generator).view(num, k, num_draws).transpose(1, 2)  # (N, S, K)
    # NOTE: p and q at the drawn tokens only (N, K, S): prefix_weights reads nothing else, and repeating the
    # (N, K, V) distributions per draw would hold S copies of them.
    index = drafts.transpose(1, 2)  # (N, K, S)
    drawn = [x.gather(-1, index).transpose(1, 2).reshape(num * num_draws, k, 1) for x in (target_probs, draft_probs)]
    flat = torch.zeros(num * num_draws, k, dtype=torch.long, device=drafts.device)  # each draw's token, now column 0
    weights = prefix_weights(drawn[0], flat, drawn[1])[:, 1:].sum(1).view(num, num_draws)
    return weights.mean(1), weights.var(1) / num_draws
