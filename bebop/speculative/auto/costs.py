"""Step-cost model of ``--mode auto``: seconds of an engine decode step by K, timed in the call.

    step(K) = draft(K) + c_verify(K) for ``to`` / ``rs`` (shared); a plain step is only ever measured.
    draft(K) = d_0 + K c_draft, d_0 >= 0 the head's pass over what the last step left pending.
    c_verify(K): a line in K through the measured depths, never below a plain step.

Deviation from the paper's speedup formula: costs are whole decode steps as the engine times them
(``Completions.step_times``), not forwards alone: on a small model the overhead decides the choice.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

StepTime = tuple[int, float, float]  # (active rows, seconds, seconds of its drafting), ``Completions.step_times``


def _line(points: list[tuple[float, float, float]], drafting: bool = False) -> tuple[float, float]:
    """(a, b) of y = a + b x by weighted least squares over (x, y, weight) points, b >= 0; a single x
    gives y constant. ``drafting``: a >= 0, and a = 0 (y proportional to x) from a single x or where a < 0.
    Example: _line([(1, 3.0, 1.0), (3, 7.0, 1.0)]) -> (1.0, 2.0)."""
    total = sum(w for _, _, w in points)
    mean_x, mean_y = sum(w * x for x, _, w in points) / total, sum(w * y for _, y, w in points) / total
    spread = sum(w * (x - mean_x) ** 2 for x, _, w in points)
    slope = max(0.0, sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points) / spread) if spread else 0.0
    if drafting and (not spread or mean_y - slope * mean_x < 0):
        return 0.0, max(0.0, sum(w * x * y for x, y, w in points) / sum(w * x * x for x, _, w in points))
    return mean_y - slope * mean_x, slope


@dataclass
class StepCosts:
    """Seconds of decode steps by K (0 = plain) and of their drafting, one probing call's: each depth's
    mean of its blocks' median steps, weighted by their timed steps. Example: steps of 9 ms at K=1 and
    16 ms at K=4 with c_draft = 2 ms give c_verify = 6.67 + K/3 ms, so step(2) = 4 + 7.33 = 11.33 ms."""

    seconds: dict[int, float] = field(default_factory=dict)  # K -> seconds per decode step
    draft_s: float | None = None  # c_draft, seconds per draft depth (None: never timed)
    draft_fixed: float = 0.0  # d_0, seconds of drafting per step whatever K
    weights: dict[int, float] = field(default_factory=dict)  # K -> timed steps behind ``seconds``
    measured: dict = field(default_factory=dict, repr=False)  # K or ("draft", K) -> [(median seconds, steps)]
    prefill_slope: float | None = None  # c_verify per extra depth from the prefill (``fit_prefill``)

    def observe(self, k: int, step_times: list[StepTime]) -> None:
        """Learns from a block of steps at depth k (0 = plain)."""
        if not step_times:
            return
        self.measured.setdefault(k, []).append((statistics.median(s for _, s, _ in step_times), len(step_times)))
        drafted = [d for _, _, d in step_times if d > 0]
        if k >= 1 and drafted:
            self.measured.setdefault(("draft", k), []).append((statistics.median(drafted), len(drafted)))
        self._refresh()

    def _refresh(self) -> None:
        """``seconds``, ``weights`` and the drafting line from the measurements."""
        values, weights = {}, {}
        for key, entries in self.measured.items():
            total = sum(w for _, w in entries)
            values[key], weights[key] = sum(w * s for s, w in entries) / total, total
        drafts = [(key[1], v, weights[key]) for key, v in values.items() if isinstance(key, tuple)]
        self.seconds = {k: v for k, v in values.items() if not isinstance(k, tuple)}
        self.weights = {k: weights[k] for k in self.seconds}
        if drafts:
            self.draft_fixed, self.draft_s = _line(drafts, drafting=True)

    def draft_seconds(self, k: int) -> float:
        """draft(K) = d_0 + K c_draft (0 for plain steps)."""
        return self.draft_fixed + k * self.draft_s if k else 0.0

    def verify_seconds(self, k: int) -> float | None:
        """c_verify(K) >= a plain step; None without a timed draft step. A line through the measured depths;
        with one drafted depth, through the plain step as K = 0, else of slope ``prefill_slope`` (or 0)."""
        points = sorted((j, s - self.draft_seconds(j), self.weights.get(j, 1.0)) for j, s in self.seconds.items()
                        if j >= 1) if self.draft_s is not None else []
        if not points:
            return None
        if len(points) == 1 and 0 in self.seconds:
            points.insert(0, (0, self.seconds[0], self.weights.get(0, 1.0)))
        if len(points) == 1:
            (j, v, _), = points
            line = v + (self.prefill_slope or 0.0) * (k - j)
        else:
            intercept, slope = _line(points)
            line = intercept + slope * k
        return max(line, self.seconds.get(0, 0.0))

    def fit_prefill(self, k: int, prompt_len: float, prefill_s: float) -> None:
        """``prefill_slope``: a prefill's ``prompt_len`` tokens a row against a verify step's k + 1, the
        difference per extra token (with the head's prefill in it, it errs toward shallower K)."""
        verify = self.verify_seconds(k) if k in self.seconds else None
        if verify is None or prompt_len <= k + 1:
            return
        self.prefill_slope = max(0.0, (prefill_s - verify) / (prompt_len - (k + 1)))

    def step_seconds(self, k: int) -> float | None:
        """Predicted seconds of a step at depth k (0 = plain), or None when nothing predicts it."""
        if k in self.seconds:
            return self.seconds[k]
        if k == 0:
            return None
        verify = self.verify_seconds(k)
        return None if verify is None else verify + self.draft_seconds(k)
