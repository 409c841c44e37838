"""Each K's acceptance replayed on recent completions, from a model of acceptance that K does not move.

Why: which tokens draft depth j sees depends on K, because steps start where the last one ended.
On the embedded task (B = 64, T = 1, offsets >= 8) depth 1's alpha_RS was 0.79 / 0.95 / 0.97 under
rs1 / rs2 / rs4, while over every position of the same completions, teacher-forced, it was 0.83
whatever K drafted them: after a rejection the next token is easy (depth 1 accepted 0.97-0.99 there
under every K), and a K's steps start after rejections at the rhythm of its own K. A K no call ran
is then forecast from the K's that ran only with that bias (an RL run holding rs1 priced rs2 low
and kept rs1 for 37 calls at 0.93x rs2's speed, bench/README.md).

The model: alpha_j depends on the draft's depth j and on the entropy of the target's distribution
at the drafted position (``ENTROPY_EDGES`` bins), pooled over every K's steps. Entropy is what
makes a position hard, and every kept token records it (``EmissionLog.kept``), whatever K or mode
emitted it. A K is then replayed on the recent completions' entropies: its steps' start positions
as a Markov chain from the first decode step (a step at offset s drafts s..s+K-1 and ends after
the first rejection, or after K accepts and the bonus), and alpha_j of an offset bucket is the
expected accepts at depth j over the expected drafts at depth j of the steps starting in it. Those
alphas carry the selection of the K's own step starts, so the tail's chain (``bebop.speculative.auto.tail``),
which takes the depths' alphas as if positions were alike, prices the K's steps right.

Measured (embedded task, B = 64, rs K = 1..4, 3 calls each): every other K's tokens per step at
offsets >= 8, relative to those of the K whose calls were seen, as ``Acceptance.alphas`` forecasts
them: median error 2.8% at T = 1 and 3.3% at T = 0.3 (worst -3.4% to +6.8% and -6.6% to +8.0%),
against 5.0% and 6.3% (-8.0% to +10.8%, -11.3% to +13.1%) from the pooled depths. A replay of one
K over 128 completions of 48 tokens takes ~0.4 ms; a probe's decision over 8 settings ~1.7 ms more.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from bebop.speculative.auto.tail import OFFSET_EDGES

ENTROPY_EDGES = (0.01, 0.05, 0.15, 0.4, 0.8, 1.2, 1.6, 2.2, 3.0)  # nats: H(p) bins of a drafted position
REPLAY_ROWS = 128  # completions replayed (the newest): enough positions for every bucket at B >= 16
FIRST_DECODE = 1  # offset of a row's first decode step: the prefill emits token 0


def entropy_bins(entropy: np.ndarray) -> np.ndarray:
    """The ``ENTROPY_EDGES`` bin of each entropy (nats), 0..len(ENTROPY_EDGES)."""
    return np.searchsorted(ENTROPY_EDGES, entropy, side="right")


@dataclass
class Replay:
    """alpha by (rule, depth, entropy bin), and the entropy bins of recent completions' positions.

    Both are decayed like the chooser's other acceptance evidence (``decay``); the completions also
    leave when REPLAY_ROWS newer ones came.
    """

    sums: dict[str, np.ndarray] = field(default_factory=dict)  # rule -> (J, bins) summed alpha
    weights: np.ndarray = field(default_factory=lambda: np.zeros((0, len(ENTROPY_EDGES) + 1)))  # (J, bins)
    rows: list[np.ndarray] = field(default_factory=list)  # entropy bin of each position of a completion
    row_weights: list[float] = field(default_factory=list)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def add_positions(self, depth: np.ndarray, entropy: np.ndarray, alphas: dict[str, np.ndarray]) -> None:
        """Drafted positions: depth (1-based), the target's entropy there, and each rule's alpha."""
        if not len(depth):
            return
        depths = max(int(depth.max()), len(self.weights))
        self.weights = np.pad(self.weights, ((0, depths - len(self.weights)), (0, 0)))
        self.sums = {r: np.pad(self.sums.get(r, np.zeros((0, self.weights.shape[1]))),
                               ((0, depths - len(self.sums.get(r, ()))), (0, 0))) for r in {*self.sums, *alphas}}
        cell = (depth - 1, entropy_bins(entropy))
        np.add.at(self.weights, cell, 1.0)
        for rule, alpha in alphas.items():
            np.add.at(self.sums[rule], cell, alpha)
        self._cache.clear()

    def add_rows(self, rows: list[np.ndarray]) -> None:
        """Completions' entropy per position (offset 0 first); empty ones are skipped."""
        for entropy in rows:
            if len(entropy):
                self.rows.append(entropy_bins(entropy).astype(np.int8))
                self.row_weights.append(1.0)
        del self.rows[:-REPLAY_ROWS], self.row_weights[:-REPLAY_ROWS]
        self._cache.clear()

    def decay(self, factor: float) -> None:
        self.weights = self.weights * factor
        self.sums = {r: s * factor for r, s in self.sums.items()}
        self.row_weights = [w * factor for w in self.row_weights]
        self._cache.clear()

    def copy(self) -> Replay:
        return Replay({r: s.copy() for r, s in self.sums.items()}, self.weights.copy(), list(self.rows),
                      list(self.row_weights))

    def to_state(self) -> dict:
        return {"sums": {r: s.tolist() for r, s in self.sums.items()}, "weights": self.weights.tolist(),
                "rows": [r.tolist() for r in self.rows], "row_weights": self.row_weights}

    @classmethod
    def from_state(cls, state: dict) -> Replay:
        """The model ``to_state`` wrote; ValueError when it does not fit (other bins or rules)."""
        bins = len(ENTROPY_EDGES) + 1
        weights = np.array(state["weights"], dtype=float).reshape(-1, bins)
        sums = {str(r): np.array(v, dtype=float).reshape(-1, bins) for r, v in state["sums"].items()}
        rows = [np.array(r, dtype=np.int64) for r in state["rows"]]
        if any(s.shape != weights.shape for s in sums.values()) or len(rows) != len(state["row_weights"]) or any(
                r.ndim != 1 or (len(r) and (r.min() < 0 or r.max() >= bins)) for r in rows):
            raise ValueError("a replay model of mismatched depths, bins or rows")
        return cls(sums, weights, [r.astype(np.int8) for r in rows], [float(w) for w in state["row_weights"]])

    def table(self, rule: str, depths: int, prior_positions: float) -> np.ndarray:
        """(depths, bins) alpha: each cell's mean shrunk toward the depth above in the same bin with the
        weight of ``prior_positions`` positions, depth 1's toward depth 1's mean over all bins (a depth
        never drafted repeats the one above; depth 1 never drafted reads 0)."""
        out = np.zeros((depths, self.weights.shape[1]))
        for j in range(depths):
            seen = j < len(self.weights)
            w = self.weights[j] if seen else np.zeros(out.shape[1])
            s = self.sums[rule][j] if seen else np.zeros(out.shape[1])
            prior = out[j - 1] if j else np.full(out.shape[1], s.sum() / w.sum() if w.sum() > 0 else 0.0)
            out[j] = (s + prior_positions * prior) / (w + prior_positions)
        return out

    def alphas(self, rule: str, k: int, prior_positions: float) -> tuple[np.ndarray, np.ndarray] | None:
        """K's alphas replayed on the completions (``replay``, the table's cells shrunk as ``table``
        says): (buckets + 1, K) alphas and the drafts behind each, the last row over all offsets; None
        without completions or drafted positions. Kept until the model next changes."""
        key = (rule, k, prior_positions)
        if key not in self._cache:
            if not self.rows or rule not in self.sums or not self.weights.sum():
                self._cache[key] = None
            else:
                if "grid" not in self._cache:
                    self._cache["grid"] = grid(self.rows)
                table = self.table(rule, k, prior_positions)
                self._cache[key] = replay(table, *self._cache["grid"], np.array(self.row_weights), k)
        return self._cache[key]


def grid(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Completions as (R, longest) arrays (``replay``'s input): each position's bin (0 past the end) and
    whether it is one of the completion's."""
    span = max(len(r) for r in rows)
    bins = np.zeros((len(rows), span), dtype=np.int64)
    inside = np.arange(span) < np.array([len(r) for r in rows])[:, None]
    bins[inside] = np.concatenate(rows)
    return bins, inside


def replay(table: np.ndarray, bins: np.ndarray, inside: np.ndarray, row_weights: np.ndarray,
           k: int) -> tuple[np.ndarray, np.ndarray]:
    """K's steps over completions whose positions accept as ``table`` says, as exact expectations.

    Args:
        table: (>= K, bins) alpha of depth j at a position of entropy bin b.
        bins, inside: the completions (``grid``).
        row_weights: (R,) each completion's weight.
        k: K.

    Returns:
        (alphas, drafts): (buckets + 1, K) each. drafts[b, j] = expected drafts at depth j + 1 of
        steps starting in offset bucket b (``OFFSET_EDGES``), the last row all buckets; alphas[b, j]
        = expected accepts there / drafts (0 where none).

    Example: one completion of 3 positions, K = 1, every position accepting 0.5: the first step (offset
    1) drafts position 1 (accept 0.5: 2 tokens, the row ends; else 1 token, a step at offset 2
    drafts position 2): 1.5 drafts, 0.75 accepts, alpha 0.5.
    """
    rows, span = bins.shape
    # shifted[j][:, s] = alpha of depth j + 1 at position s + j (0 past the completion's end)
    shifted = np.zeros((k, rows, span))
    reach = np.ones((k + 1, rows, span))  # reach[j]: P(depths 1..j all accepted)
    for j in range(k):
        shifted[j, :, :span - j] = table[j][bins[:, j:]] * inside[:, j:]
        np.multiply(reach[j], shifted[j], out=reach[j + 1])
    # A step at s emits n tokens: n = j + 1 (depth j + 1 rejected after j accepts) or K + 1 (all accepted)
    emits = np.concatenate([reach[:k] * (1.0 - shifted), reach[k:]]).transpose(2, 1, 0)  # (span, R, K + 1)
    start = np.zeros((span + k + 1, rows))  # P(a step starts at offset s)
    start[FIRST_DECODE] = 1.0
    for s in range(FIRST_DECODE, int(inside.sum(1).max())):
        start[s + 1: s + k + 2] += (start[s, :, None] * emits[s]).T
    start = start[:span].T * inside * row_weights[:, None]  # (R, span)
    drafted = np.zeros((k, span))  # depth j + 1 drafted by steps at s (position s + j inside), rows summed
    for j in range(k):
        drafted[j, :span - j] = np.einsum("rs,rs->s", (start * reach[j])[:, :span - j], inside[:, j:])
    accepted = np.einsum("rs,jrs->js", start, reach[1:])
    edges = [0, *(e for e in OFFSET_EDGES if e < span)]
    drafts = np.zeros((len(OFFSET_EDGES) + 2, k))
    accepts = np.zeros_like(drafts)
    drafts[:len(edges)] = np.add.reduceat(drafted, edges, axis=1).T
    accepts[:len(edges)] = np.add.reduceat(accepted, edges, axis=1).T
    drafts[-1], accepts[-1] = drafted.sum(1), accepted.sum(1)
    return np.divide(accepts, drafts, out=np.zeros_like(drafts), where=drafts > 0), drafts
