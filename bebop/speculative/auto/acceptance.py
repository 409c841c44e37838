"""Acceptance model of ``--mode auto``: alpha_j per draft depth, completion offset and K.

    alpha_j   acceptance at depth j given drafts 1..j-1 accepted: the mean of alpha_RS = sum min(p_j, q_j) and
              alpha_TO = p_j(argmax q_j) (p the target's, q the draft's), recorded at every kept draft position
              whichever mode ran (``bebop.speculative.stats``); at T = 0, whether it was accepted (greedy).
    E[L]      expected accepted drafts per verify step, sum_{j<=K} prod_{i<=j} alpha_i (Leviathan et al.
              2023; arXiv 2606.12370 Eq. 12); a verify step emits 1 + E[L] tokens.

Deviations from the paper's one alpha per depth:
    1) alpha also differs by completion offset (``OFFSET_EDGES``) and by the K of the drafting steps
       (which tokens depth j sees moves with K), each shrunk toward the coarser table (``Acceptance.alphas``).
    2) alpha_TO recorded while ``rs`` runs (and vice versa) sees the other rule's accepted prefixes: a bias at j >= 2.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bebop.speculative.auto.tail import OFFSET_EDGES
from bebop.speculative.stats import EmissionLog

PRIOR_POSITIONS = 4.0  # weight, in positions, of the coarser estimate a depth's mean is shrunk toward
DECAY = 0.9  # weight kept by older acceptance evidence at each call (RL: the policy drifts; ~10 calls of memory)
RULES = ("rs", "to")  # acceptance rules, named as the modes that use them


def expected_accepted(alphas: list[float]) -> float:
    """E[L] = sum_j prod_{i<=j} alpha_i. Example: expected_accepted([0.5, 0.5]) = 0.5 + 0.25 = 0.75."""
    total, prod = 0.0, 1.0
    for a in alphas:
        prod *= a
        total += prod
    return total


def _shrunk(table: Acceptance, rule: str, prior: list[float]) -> list[float]:
    """Each depth's mean in ``table`` shrunk toward ``prior`` with the weight of PRIOR_POSITIONS positions."""
    return [(table.sums[rule][j] + PRIOR_POSITIONS * a) / (table.weights[j] + PRIOR_POSITIONS)
            if j < len(table.weights) else a for j, a in enumerate(prior)]


@dataclass
class Acceptance:
    """Per-depth acceptance of both rules: weighted alpha sums and weights, overall, per offset bucket and per K."""

    sums: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in RULES})  # rule -> (J,) alpha sums
    weights: list[float] = field(default_factory=list)  # (J,) recorded positions per depth
    by_offset: list[Acceptance] = field(default_factory=list)  # the same per offset bucket (empty: never observed)
    by_k: dict[int, Acceptance] = field(default_factory=dict)  # the same per K of the drafting steps

    def add(self, depth: int, weight: float, alpha_rs: float, alpha_to: float) -> None:
        """Adds ``weight`` positions at ``depth`` (1-based) whose alphas sum to alpha_rs, alpha_to."""
        while len(self.weights) < depth:
            self.weights.append(0.0)
            for rule in RULES:
                self.sums[rule].append(0.0)
        self.weights[depth - 1] += weight
        self.sums["rs"][depth - 1] += alpha_rs
        self.sums["to"][depth - 1] += alpha_to

    def observe(self, log: EmissionLog, lengths: list[int], greedy: bool, age: float = 1.0) -> None:
        """Adds a call's kept draft positions (at T = 0: whether each was accepted; the recorded alphas are
        T = 1 numbers); each K that ran first ages its own table by ``age`` (only in calls that run it)."""
        kept = log.kept(lengths)  # every kept draft position, flat (M,) arrays
        rs, to = (kept.accepted, kept.accepted) if greedy else (kept.values[1], kept.values[2])
        bucket = np.searchsorted(OFFSET_EDGES, kept.offset, side="right")
        self._add_positions(kept.depth, bucket, rs, to)
        for k in np.unique(kept.k).tolist():
            sel, own = kept.k == k, self.by_k.setdefault(k, Acceptance())
            own.decay(age)
            own._add_positions(kept.depth[sel], bucket[sel], rs[sel], to[sel])

    def _add_positions(self, depth: np.ndarray, bucket: np.ndarray, rs: np.ndarray, to: np.ndarray) -> None:
        if not self.by_offset:
            self.by_offset = [Acceptance() for _ in range(len(OFFSET_EDGES) + 1)]
        if not len(depth):
            return
        buckets, size = len(self.by_offset), int(depth.max()) * len(self.by_offset)
        key = (depth - 1) * buckets + bucket  # (depth, bucket) cells, summed at once
        sums = [np.bincount(key, w, size).reshape(-1, buckets).tolist() for w in (None, rs, to)]
        for j, (weight, alpha_rs, alpha_to) in enumerate(zip(*sums), start=1):
            if sum(weight):
                self.add(j, sum(weight), sum(alpha_rs), sum(alpha_to))
            for sub, w, a_rs, a_to in zip(self.by_offset, weight, alpha_rs, alpha_to):
                if w:
                    sub.add(j, w, a_rs, a_to)

    def copy(self) -> Acceptance:
        return Acceptance({r: list(v) for r, v in self.sums.items()}, list(self.weights),
                          [sub.copy() for sub in self.by_offset], {k: t.copy() for k, t in self.by_k.items()})

    def to_state(self) -> dict:
        """The tables as JSON-able lists and dicts (not copies: dump them before the next call)."""
        return {"sums": self.sums, "weights": self.weights, "by_offset": [sub.to_state() for sub in self.by_offset],
                "by_k": {str(k): t.to_state() for k, t in self.by_k.items()}}

    @classmethod
    def from_state(cls, state: dict) -> Acceptance:
        """The table ``to_state`` wrote; ValueError when it does not fit (other depths, buckets or rules)."""
        weights = [float(w) for w in state["weights"]]
        sums = {r: [float(x) for x in state["sums"][r]] for r in RULES}
        by_offset = [cls.from_state(sub) for sub in state["by_offset"]]
        if any(len(v) != len(weights) for v in sums.values()) or len(by_offset) not in (0, len(OFFSET_EDGES) + 1):
            raise ValueError("acceptance tables of mismatched depths or offset buckets")
        return cls(sums, weights, by_offset, {int(k): cls.from_state(t) for k, t in state["by_k"].items()})

    def decay(self, factor: float) -> None:
        """Older evidence weighs ``factor`` times less: overall and per offset bucket (``by_k`` ages in ``observe``)."""
        self.weights = [w * factor for w in self.weights]
        self.sums = {r: [s * factor for s in v] for r, v in self.sums.items()}
        for sub in self.by_offset:
            sub.decay(factor)

    def alphas(self, rule: str, k: int, bucket: int | None = None) -> list[float]:
        """alpha_1..alpha_K of a rule, each estimate shrunk toward a coarser one (m = PRIOR_POSITIONS):
        1. all positions: alpha_1 is depth 1's mean (0 if unseen); depth j (weight w_j, alpha sum s_j)
           gives (s_j + m alpha_{j-1}) / (w_j + m): a depth seen a few times leans on the one above;
        2. with ``bucket``, that bucket's depth j: (s_j + m a_j) / (w_j + m), a_j from step 1;
        3. when steps ran at this K, the same again with its own steps (in the bucket) as the evidence.
        Example: seen [0.8, 0.6] with 100 positions each -> alphas(rule, 3) ~ [0.8, 0.601, 0.601]."""
        out: list[float] = []
        for j in range(k):
            w = self.weights[j] if j < len(self.weights) else 0.0
            total = self.sums[rule][j] if j < len(self.weights) else 0.0
            if j == 0:
                out.append(total / w if w > 0 else 0.0)
            else:
                out.append((total + PRIOR_POSITIONS * out[-1]) / (w + PRIOR_POSITIONS))
        if bucket is not None and self.by_offset:
            out = _shrunk(self.by_offset[bucket], rule, out)
        own = self.by_k.get(k)
        if own is not None:
            out = _shrunk(own.by_offset[bucket] if bucket is not None and own.by_offset else own, rule, out)
        return out

    def offset_alphas(self, rule: str, k: int) -> list[list[float]]:
        """``alphas`` of every offset bucket (``bebop.speculative.auto.tail.finished``)."""
        return [self.alphas(rule, k, b) for b in range(len(OFFSET_EDGES) + 1)]
