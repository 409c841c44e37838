"""The batch's tail in ``--mode auto``'s prediction: a call's decode steps priced row by row.

A batch decodes in lockstep: every step runs the rows still active, and the call lasts until its
longest row ends. Late steps run few rows, so a call's tokens/s is lower than rows (1 + E[L]) / step
cost at the rows decoding now. ``call_rate`` simulates the rest of a call instead:

    remaining   tokens each active row still emits: drawn from the running completion lengths
                longer than what the row has emitted (``Lengths``), capped at max_new_tokens; the cap
                itself when no such length was seen.
    steps       per row, the steps that emit them: one token per plain step; 1 + L per verify
                step, L drawn with P(L >= j) = prod_{i<=j} alpha_i (the acceptance model).
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


@functools.lru_cache(maxsize=8)
def _uniforms(shape: tuple[int, ...]) -> np.ndarray:
    """The draws of ``call_rate`` for one (S, R, n) shape: the same for every setting, so made once (read-only)."""
    u = np.random.default_rng(SEED + 1).random(shape)
    u.setflags(write=False)
    return u


def steps_needed(remaining: np.ndarray, alphas: list[float], rng: np.random.Generator | None = None) -> np.ndarray:
    """(S, R) decode steps that emit ``remaining`` tokens; ``alphas`` empty for plain steps.

    The acceptance draws come from ``rng``, or (None) are ``call_rate``'s common ones.
    """
    if not alphas:
        return remaining.copy()
    n = int(remaining.max())
    shape = remaining.shape + (n,)
    u = rng.random(shape) if rng is not None else _uniforms(shape)  # (S, R, n)
    accepted = sum((u < p).astype(np.int64) for p in np.cumprod(alphas))  # (S, R, n) L = #{j: u < P(L >= j)}
    emitted = np.cumsum(1 + accepted, axis=-1)  # (S, R, n) tokens after each step
    return (emitted < remaining[..., None]).sum(-1) + 1


def call_rate(remaining: np.ndarray, alphas: list[float], step_seconds: Callable[[np.ndarray], np.ndarray],
              prefill_s: float = 0.0) -> float:
    """Predicted tokens/s of the rest of a call: E[tokens] / (prefill_s + E[sum of step seconds]).

    Args:
        remaining: (S, R) tokens left per row (``Lengths.remaining``).
        alphas: alpha_1..alpha_K of the setting; empty for plain decoding.
        step_seconds: seconds of one step at an array of active-row counts.
        prefill_s: seconds before the first step (0 for the rest of a started call).
    """
    steps = steps_needed(remaining, alphas)  # (S, R), the same draws for every setting
    active = (steps[:, :, None] > np.arange(int(steps.max()))).sum(1)  # (S, n) rows in each step
    seconds = np.where(active > 0, step_seconds(np.maximum(active, 1)), 0.0).sum(-1)  # (S,)
    total = prefill_s + float(seconds.mean())
    return float(remaining.sum(-1).mean()) / total if total > 0 else 0.0
