"""The batch's tail in ``--mode auto``'s prediction: a call's decode steps priced row by row.

A batch decodes in lockstep: every step runs the rows still active, and the call lasts until its
longest row ends. Late steps run few rows, so a call's tokens/s is lower than rows (1 + E[L]) / step
cost at the rows decoding now. ``call_rates`` simulates the rest of a call instead, every
candidate setting at once:

    remaining   tokens each active row still emits: drawn from the running completion lengths
                longer than what the row has emitted (``Lengths``), capped at max_new_tokens; the cap
                itself when no such length was seen.
    steps       per row, the steps that emit them: one token per plain step; 1 + L per verify
                step, L drawn with P(L >= j) = prod_{i<=j} alpha_i (the acceptance model), the
                alphas of the step's offset bucket (``OFFSET_EDGES``: tokens the row had emitted
                before the step) when the model has them per offset.
    seconds     prefill + sum over steps of the step cost at the rows active in that step.
    tokens/s    E[sum of remaining] / E[seconds], over SCENARIOS draws from a fixed seed: the same
                draws for every setting (common random numbers), none from the rows' randomness.

Example: two rows with 2 and 10 tokens left, plain, 1 ms a step at any rows: 10 steps, 12 tokens,
1200 tokens/s; rows (tokens per step) / step cost would say 2000.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

SCENARIOS = 16  # Monte Carlo draws per prediction (common to all settings)
HISTORY = 4096  # completion lengths kept (the newest)
SEED = 0  # the draws' seed: a prediction is a function of the models only
# NOTE: a completion's first tokens accept least (embedded task, rs K=4, B=64, alpha_RS at depth 1 by the
# tokens emitted before the step: 0.64-0.73 at 0-3, 0.88-0.92 at 4-7, 0.95-0.99 from 8 on, T 0.3-1). One
# alpha for all offsets prices a deep K's opener too high and its later steps too low.
OFFSET_EDGES = (4, 8)  # offset buckets [0, 4), [4, 8), [8, max_new_tokens)


@dataclass
class Lengths:
    """Completion lengths (tokens, EOS included) of recent calls, the newest HISTORY."""

    seen: list[int] = field(default_factory=list)

    def add(self, lengths: list[int]) -> None:
        self.seen = (self.seen + [int(n) for n in lengths])[-HISTORY:]

    def remaining(self, generated: list[int], max_new: int, rng: np.random.Generator) -> np.ndarray:
        """(SCENARIOS, R) tokens each row still emits, given what it has emitted so far."""
        seen = np.sort(np.minimum(np.asarray(self.seen, dtype=np.int64), max_new))
        done = np.asarray(generated, dtype=np.int64)  # (R,)
        first = np.searchsorted(seen, done, side="right")  # (R,) the seen lengths > done start here
        pool = len(seen) - first  # (R,)
        pick = first + (rng.random((SCENARIOS, len(done))) * pool).astype(np.int64)  # (S, R)
        drawn = seen[np.minimum(pick, len(seen) - 1)] if len(seen) else np.zeros_like(pick)
        return np.maximum(np.where(pool > 0, drawn, max_new) - done, 1)  # (S, R)


@functools.lru_cache(maxsize=16)
def _uniforms(shape: tuple[int, ...], seed: int = SEED + 1) -> np.ndarray:
    """The draws of ``call_rates`` for one (S, R, n) shape: the same for every setting, so made once (read-only)."""
    u = np.random.default_rng(seed).random(shape, dtype=np.float32)
    u.setflags(write=False)
    return u


def _per_bucket(alphas) -> list:
    """A setting's alphas as one list per bucket: nested (per offset bucket) as is, flat as one bucket."""
    return alphas if len(alphas) and isinstance(alphas[0], (list, tuple)) else [alphas]


def _thresholds(alphas, k: int) -> np.ndarray:
    """(buckets, k) P(L >= j) of one setting from its alphas (flat: one bucket; nested: one list per
    offset bucket; empty: plain decoding, never a draft), zero past its own K."""
    rows = _per_bucket(alphas)
    out = np.zeros((len(rows), k))
    for b, a in enumerate(rows):
        out[b, :len(a)] = np.cumprod(a)
    return out


def _steps(remaining: np.ndarray, thresholds: np.ndarray, done, rng: np.random.Generator | None) -> np.ndarray:
    """(N, S, R) steps of N settings, ``thresholds`` (N, buckets, K) P(L >= j), the same draws for all."""
    draw = (lambda shape, seed: rng.random(shape)) if rng is not None else _uniforms
    steps = np.zeros((len(thresholds),) + remaining.shape, dtype=np.int64)
    left = np.broadcast_to(remaining, steps.shape).copy()
    if thresholds.shape[1] > 1:  # per offset bucket: step by step while a row's offset is below the last edge
        opener = OFFSET_EDGES[-1]  # a step there emits >= 1 token: at most this many steps
        offset = np.broadcast_to(np.asarray(done, dtype=np.int64), steps.shape).copy()
        u = draw(remaining.shape + (opener,), SEED + 2)[None]  # (1, S, R, opener)
        # L of every opener step under each bucket below the last edge, picked below by the row's offset
        drafts = [_accepted(u, thresholds[:, b]) for b in range(len(OFFSET_EDGES))]  # (N, S, R, opener) each
        for i in range(opener):
            active = (left > 0) & (offset < opener)
            if not active.any():
                break
            accepted = drafts[0][..., i]
            for b, edge in enumerate(OFFSET_EDGES[:-1], start=1):
                accepted = np.where(offset >= edge, drafts[b][..., i], accepted)
            emit = np.where(active, 1 + accepted, 0)
            left, offset, steps = left - emit, offset + emit, steps + active
        left = np.maximum(left, 0)
    n = int(left.max())
    if n == 0:
        return steps
    u = draw(remaining.shape + (n,), SEED + 1)[None]  # (1, S, R, n)
    emitted = _accepted(u, thresholds[:, -1]) + np.int16(1)  # (N, S, R, n) 1 + L per step
    np.cumsum(emitted, axis=-1, out=emitted)  # tokens after each step
    return steps + np.where(left > 0, (emitted < left[..., None]).sum(-1) + 1, 0)


def _accepted(u: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """(N, S, R, n) L = #{j: u < P(L >= j)} of draws u (1, S, R, n) at N settings' thresholds (N, K)."""
    out = np.zeros((len(thresholds),) + u.shape[1:], dtype=np.int16)
    for j in range(thresholds.shape[1]):
        out += u < thresholds[:, j, None, None, None].astype(u.dtype)
    return out


def steps_needed(remaining: np.ndarray, alphas, rng: np.random.Generator | None = None,
                 done: np.ndarray | None = None) -> np.ndarray:
    """(S, R) decode steps that emit ``remaining`` tokens; ``alphas`` empty for plain steps.

    ``alphas``: alpha_1..alpha_K at every offset, or one such list per offset bucket
    (``OFFSET_EDGES``), then ``done`` (R,) the tokens each row has emitted: steps that start below
    the last edge draw from their bucket's alphas, the rest from the last bucket's. The acceptance
    draws come from ``rng``, or (None) are ``call_rates``'s common ones.
    """
    if not len(alphas):
        return remaining.copy()
    return _steps(remaining, _thresholds(alphas, len(_per_bucket(alphas)[-1]))[None], done, rng)[0]


def call_rates(remaining: np.ndarray, alphas: list, step_seconds: Callable[[np.ndarray], np.ndarray],
               prefill_s: float = 0.0, done: np.ndarray | None = None) -> np.ndarray:
    """Predicted tokens/s of the rest of a call at N settings: E[tokens] / (prefill_s + E[sum of step seconds]).

    Args:
        remaining: (S, R) tokens left per row (``Lengths.remaining``).
        alphas: per setting, alpha_1..alpha_K, or one list per offset bucket (``steps_needed``; then
            every setting's), or empty for plain decoding.
        step_seconds: (N, S, n) active-row counts -> seconds of those steps at each setting.
        prefill_s: seconds before the first step (0 for the rest of a started call).
        done: (R,) tokens each row has emitted (needed when a setting has alphas per offset bucket).

    Returns:
        (N,) tokens/s, all settings simulated at once on the same draws (a decision prices ~9).
    """
    k = max([len(_per_bucket(a)[-1]) for a in alphas] + [1])  # every setting padded to the deepest K
    per = [_thresholds(a, k) for a in alphas]
    buckets = max(len(t) for t in per)
    thresholds = np.stack([np.repeat(t, buckets // len(t), axis=0) for t in per])  # (N, buckets, K)
    steps = _steps(remaining, thresholds, done, None)  # (N, S, R)
    active = (steps[..., None] > np.arange(int(steps.max()))).sum(2)  # (N, S, n) rows in each step
    seconds = np.where(active > 0, step_seconds(np.maximum(active, 1)), 0.0).sum(-1)  # (N, S)
    total = prefill_s + seconds.mean(-1)
    return np.where(total > 0, remaining.sum(-1).mean() / np.maximum(total, 1e-30), 0.0)

