"""The batch's lockstep tail in ``--mode auto``'s prediction, priced exactly (expectations, no sampling).

A batch decodes until its longest row ends, so its tokens/s is below rows (1 + E[L]) / step cost.
``call_rates`` prices it at every candidate setting at once: each row's remaining tokens drawn from
recent completion lengths (``Lengths.rows``); 1 + L tokens a verify step, P(L >= j) = prod_{i<=j} alpha_i
at the step's offset bucket, a Markov chain (``finished``); tokens/s = E[tokens] / (step cost x E[steps]).

Example: rows with 2 and 10 tokens left, plain, 1 ms a step: 10 steps, 12 tokens, 1200 tok/s (not 2000).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

HISTORY = 4096  # completion lengths kept (the newest)
OFFSET_EDGES = (4, 8)  # offset buckets [0, 4), [4, 8), [8, max_new_tokens): a completion's opener accepts least


@dataclass
class Rows:
    """The active rows of a call, grouped by the tokens they have emitted: ``count[g]`` rows that have
    emitted ``done[g]`` tokens and still emit m with probability ``left[g, m]`` (m >= 1)."""

    done: np.ndarray  # (G,) int
    count: np.ndarray  # (G,) int
    left: np.ndarray  # (G, C + 1) probabilities over the tokens still to emit, 0..C

    def tokens(self) -> float:
        """E[tokens the rows still emit]."""
        return float(self.count @ (self.left @ np.arange(self.left.shape[1])))


@dataclass
class Lengths:
    """Completion lengths (tokens, EOS included) of recent calls, the newest HISTORY."""

    seen: list[int] = field(default_factory=list)

    def add(self, lengths: list[int]) -> None:
        self.seen = (self.seen + [int(n) for n in lengths])[-HISTORY:]

    def rows(self, generated: list[int], max_new: int) -> Rows:
        """``Rows`` of rows that have emitted ``generated`` tokens: each emits a seen length longer than that
        (uniform over them, capped at max_new), or the cap when none is longer, less what it emitted."""
        seen = np.minimum(np.asarray(self.seen, dtype=np.int64), max_new)
        done, count = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
        left = np.zeros((len(done), max(max_new, 1) + 1))
        for g, d in enumerate(done.tolist()):
            longer = seen[seen > d] - d
            if len(longer):
                left[g] = np.bincount(longer, minlength=left.shape[1]) / len(longer)
            else:
                left[g, max(max_new - d, 1)] = 1.0
        return Rows(done, count, left)


def _thresholds(alphas, k: int) -> np.ndarray:
    """(buckets, k) P(L >= j) of one setting's alphas (flat, per offset bucket, or [] for plain), 0 past its K."""
    per = alphas if len(alphas) and isinstance(alphas[0], (list, tuple)) else [alphas]
    out = np.zeros((len(per), k))
    for b, a in enumerate(per):
        out[b, :len(a)] = np.cumprod(a)
    return out


def finished(rows: Rows, alphas: list) -> np.ndarray:
    """(N, G, T + 1) P(a row of group g has emitted all it has left after t steps) at N settings, t = 0..T,
    T the most tokens a row can still emit. A Markov chain per setting over o, the tokens a row has
    emitted (O absorbing): a step at o emits 1 + L, L at the alphas of o's offset bucket. Past the last
    edge the chain is the same at every o, so a group that has emitted more starts at the edge, its target
    shifted with it: at most OFFSET_EDGES[-1] + 1 chains whatever the batch; t = 0..T by doubling."""
    k = max([_depth(a) for a in alphas] + [1])  # every setting padded to the deepest K
    per = [_thresholds(a, k) for a in alphas]
    buckets = max(len(t) for t in per)
    thr = np.stack([np.repeat(t, buckets // len(t), axis=0) for t in per])  # (N, buckets, K)
    n = len(per)
    width = int(np.flatnonzero(rows.left.any(0)).max(initial=0)) + 1  # NOTE: no row emits more: a smaller chain
    edge = np.ones((n, buckets, 1))
    p_len = -np.diff(np.concatenate([edge, thr, 0 * edge], -1), axis=-1)  # (N, buckets, K + 1) P(L = l)
    begin = np.minimum(rows.done, OFFSET_EDGES[-1])  # (G,) where each group's chain starts
    starts, chain = np.unique(begin, return_inverse=True)
    lo, last = int(starts.min()), int(starts.max()) + width - 1  # O: the most tokens a row can reach
    o = np.arange(lo, last + 1)  # the states, o - lo as indices
    p = p_len[:, np.minimum(np.searchsorted(OFFSET_EDGES, o, side="right"), buckets - 1)]  # (N, S, K+1)
    move = np.zeros((n, len(o), len(o)))  # (N, from o, to o')
    for length in range(k + 1):
        src = np.flatnonzero(o + 1 + length < last)
        move[:, src, src + 1 + length] = p[:, src, length]
    move[..., -1] = 1.0 - move[..., :-1].sum(-1)  # at or past O: absorbed (row O stays)
    chains = len(starts)
    total = width * chains  # t = 0..T, T = width - 1
    dist = np.zeros((n, total, len(o)))  # (N, t x chains, o): after t = 0..T steps, t-major
    dist[:, np.arange(chains), starts - lo] = 1.0
    done, power = chains, move
    while done < total:  # NOTE: doubling: steps [t, 2t) are steps [0, t) moved t further
        more = min(done, total - done)
        np.matmul(dist[:, :more], power, out=dist[:, done: done + more])
        done += more
        if done < total:
            power = power @ power
    finish = np.zeros((len(begin), len(o)))  # (G, S) P(the row's last token is at or before o)
    for g, b in enumerate(begin.tolist()):
        finish[g, b - lo: b - lo + width] = rows.left[g, :width]
    reached = dist.reshape(n, width, chains, len(o))[:, :, chain]  # (N, T + 1, G, S)
    return np.einsum("ntgo,go->ngt", reached, np.cumsum(finish, -1))


def _depth(alphas) -> int:
    """The K of one setting's alphas (0: plain)."""
    return len(alphas[-1]) if len(alphas) and isinstance(alphas[0], (list, tuple)) else len(alphas)


def steps_left(rows: Rows, alphas: list) -> np.ndarray:
    """(N, T + 1) P(another step follows step t) at N settings, rows independent; summed: E[steps left]."""
    done_by = finished(rows, alphas)  # (N, G, T + 1)
    return 1.0 - np.prod(done_by ** rows.count[None, :, None], axis=1)


def call_rates(
    rows: Rows,  # the active rows and their remaining tokens (``Lengths.rows``)
    alphas: list,  # per setting: alpha_1..alpha_K, or one list per offset bucket, or [] for plain decoding
    base: np.ndarray,  # (N,) seconds of a step of each setting
) -> np.ndarray:
    """Predicted tokens/s of the rest of a call at N settings: E[tokens] / E[step seconds]."""
    seconds = np.asarray(base, dtype=float) * steps_left(rows, alphas).sum(-1)
    return np.where(seconds > 0, rows.tokens() / np.maximum(seconds, 1e-30), 0.0)
