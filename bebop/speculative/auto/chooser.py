"""Automatic choice of the verification mode and depth K (``--mode auto``, ``--speculate-k auto``).

Terms (K = speculation depth, R = rows decoding, p the target's distribution, q the draft's):
    alpha_j     acceptance at draft depth j given drafts 1..j-1 were accepted. Estimated by the mean
                of the counterfactual alpha_RS = sum min(p_j, q_j) and alpha_TO = p_j(argmax q_j) that
                the engine records at every kept draft position (``bebop.speculative.stats``), whichever mode
                ran; at T = 0 by the accepted / reached counts (both rules are then greedy matching);
                per offset in the completion and leaning on the steps run at that K (``Acceptance``).
    E[L]        expected accepted drafts per verify step, sum_{j<=K} prod_{i<=j} alpha_i (arXiv
                2606.12370 Eq. 12; Leviathan et al. 2023); a verify step emits 1 + E[L] tokens.
    step cost   seconds of one engine decode step: plain_s for ``none``; d_0 + K c_draft + c_verify(K)
                for ``to``/``rs``, from steps and their drafting timed by the engine (``StepCosts``).
    predicted   tokens/s of the rest of the call, its tail priced (``bebop.speculative.auto.tail``): the rows'
                remaining tokens distributed as the completion lengths seen, the steps each row needs
                at 1 + L tokens a step, every step at the cost of its active rows, the call lasting
                until its longest row ends, all as exact expectations. Without the rows' state
                (``shallow_could_win``): R (1 + E[L]) / step cost (``none``: R / plain_s).

``generate_auto`` runs one engine call (``bebop.speculative.engine.Decoder``) that switches settings
between decode steps, every token kept: a probe (``_probe``: one plain step when plain decoding is
allowed; steps at the deepest K; then steps at a shallower K if one could win), then the rest at
the setting with the highest predicted tokens/s. An RL run (``bebop.rollout``) probes every
``auto_every`` steps and, in between, runs the last decision (``probe=False``: no probe step, no
pricing); a setting chosen for the first time is confirmed by a probe in the next call
(``AutoChooser.settle``). A probe times its step costs afresh (``AutoChooser.restart``): every
setting it compares is timed in the same call, at the machine's speed of that moment; their ratios
to the deep K's step are pooled over the probes at that batch size (``CostShape``: the level is the
call's, the shape across depths the memory's, as a step's own noise is 10-17%). What the
policy sets, the acceptance (decayed) and the completion lengths, is carried from call to call:
it needs many positions and moves only as the policy does.

Exactness: each step is an exact step of its setting, drawn from its rows' randomness at a counter
no other step uses, and the setting of a step depends only on the steps before it (and on
timings); each token is therefore drawn from p given its prefix whatever was chosen, and at T = 0
every step is greedy.

Deviations from the paper's speedup formula:
    1) Costs are whole engine decode steps (drafting, verify forward, verification, bookkeeping) as
       the engine times them (``Completions.step_times``), not forwards alone: the overhead
       around the forwards decides the choice on a small model. c_verify(K) is what a step costs
       besides its drafting, a line in K (``StepCosts.verify_seconds``). ``to`` and ``rs`` share
       the costs (they differ only in sampling drafts from q).
    2) alpha_TO recorded while ``rs`` runs (and alpha_RS while ``to`` runs) is measured on the other
       rule's accepted prefixes, a small bias at depths >= 2.
    3) A depth with few recorded positions leans on the depth above it (``Acceptance.alphas``).
       The paper's alphas are one per depth; here they also differ by offset in the completion and
       by the K whose steps drafted them (measured: ``Acceptance``): a K is forecast by replaying
       its steps on recent completions (``bebop.speculative.auto.replay``: alpha by depth and the target's
       entropy, which K does not move), and leans on its own steps where it ran.
    4) The tail is priced from the completion lengths of earlier calls; a run's first call has none,
       so its rows are assumed to run to max_new_tokens (no tail: an overestimate, reported by
       ``bench/auto.py``). ``bebop generate`` keeps the chooser in a profile between calls
       (``bebop.speculative.auto.profile``), so only a model's first call has none.
    5) The probe steps run settings that may be slower than the chosen one: the price of a
       one-shot call; an RL run, or generate calls sharing a profile, pay it once every
       ``auto_every`` (AUTO_EVERY) calls.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from bebop.config import AUTO, AUTO_MAX_K
from bebop.speculative.completions import Completions
from bebop.speculative.engine import Decoder
from bebop.speculative.settings import SamplingParams, SpecConfig, check_settings
from bebop.speculative.auto.replay import Replay
from bebop.speculative.stats import EmissionLog, KeptTokens
from bebop.speculative.auto.tail import OFFSET_EDGES, Lengths, Rows, call_rates
from bebop.utils.io import BebopError

PROBE_STEPS = 2  # decode steps of each probed setting: enough to time a step, few enough to cost little
# NOTE: a completion's first tokens are its least predictable (the embedded task's opener: alpha_RS ~0.1
# at depth 1 at T = 0.3, ~0.9 later), so a B = 1 probe of 2 steps mistakes them for the whole call.
PROBE_POSITIONS = 8  # rows x steps of the deep probe at least: its alphas' evidence
PRIOR_POSITIONS = 4.0  # weight of depth j-1's alpha in depth j's estimate (``Acceptance.alphas``)
DECAY = 0.9  # weight kept by older acceptance evidence at each call (RL: the policy drifts; ~10 calls of memory)
GAMMA_PRIOR_STEPS = 30.0  # weight, in timed steps, of the other depths' gamma in a depth's (``StepCosts.gamma``)
# NOTE: the prefill emits every row's first token, so a fresh call's decode steps start at offset 1. Priced
# from offset 0, a whole call had a token too many per row (B = 16, T = 1, lengths known, 12 calls a
# setting: plain priced 27 steps for its 26, rs1-rs4 3.3-4.1% more steps than from offset 1)
PREFILL_TOKENS = 1  # tokens the prefill emits per row
ROW_FIT_STEPS = 4  # fewest steps of a block that fits gamma (``StepCosts.fit_rows``), over rows spanning half the most
RULES = ("rs", "to")  # acceptance rules, named as the modes that use them
SHAPE_DECAY = 0.8  # weight kept by a batch size's earlier cost ratios at each probe (``CostShape``; ~5 probes)


def candidates(spec: SpecConfig) -> list[tuple[str, int]]:
    """The (mode, K) pairs a spec allows, K = 0 for ``none``; simplest first (ties keep the first).

    Example: candidates(SpecConfig("rs", "auto")) -> [("rs", 1), ("rs", 2), ("rs", 3), ("rs", 4)].
    """
    modes = ("none", "to", "rs") if spec.mode == AUTO else (spec.mode,)
    ks = range(1, AUTO_MAX_K + 1) if spec.speculate_k == AUTO else (spec.speculate_k,)
    return [(m, 0) if m == "none" else (m, k) for m in modes for k in ((0,) if m == "none" else ks)]


def is_auto(spec: SpecConfig) -> bool:
    return spec.mode == AUTO or (spec.speculate_k == AUTO and spec.mode != "none")


def check_auto_spec(spec: SpecConfig) -> None:
    """Raises BebopError (one line) on a mode or K no choice could use."""
    check_settings(spec, None)


def expected_accepted(alphas: list[float]) -> float:
    """E[L] = sum_j prod_{i<=j} alpha_i.

    Example: expected_accepted([0.5, 0.5]) = 0.5 + 0.25 = 0.75.
    """
    total, prod = 0.0, 1.0
    for a in alphas:
        prod *= a
        total += prod
    return total


def draft_positions(log: EmissionLog, lengths: list[int]) -> dict[str, np.ndarray]:
    """Every kept draft position of a call (``EmissionLog.kept``), as flat arrays: depth (1-based),
    offset (tokens its row had emitted before the step), k (the step's K), alpha_rs, alpha_to, and
    accepted (the draft was accepted). Blocks in order, rows in order, depths in order."""
    kept = log.kept(lengths)
    return {"depth": kept.depth, "offset": kept.offset, "k": kept.k, "alpha_rs": kept.values[1],
            "alpha_to": kept.values[2], "accepted": kept.accepted}


def completion_entropies(kept: KeptTokens, lengths: list[int]) -> list[np.ndarray]:
    """Each completion's H(p) per position, offset 0 first, as far as its kept tokens reach (a call
    still decoding: what its rows emitted so far)."""
    grid = np.full((len(lengths), max(lengths, default=0) + 1), np.nan)  # NOTE: a last column never filled
    grid[kept.token_row, kept.token_offset] = kept.token_entropy
    reach = np.isnan(grid).argmax(1)  # each row's first position without a kept token
    return [grid[r, :n] for r, n in enumerate(reach.tolist())]


def _shrunk(table: Acceptance, rule: str, prior: list[float]) -> list[float]:
    """Each depth's mean in ``table`` shrunk toward ``prior`` with the weight of PRIOR_POSITIONS positions."""
    return [(table.sums[rule][j] + PRIOR_POSITIONS * a) / (table.weights[j] + PRIOR_POSITIONS)
            if j < len(table.weights) else a for j, a in enumerate(prior)]


@dataclass
class Acceptance:
    """Running per-depth acceptance of both rules: weighted sums of alpha and their weights, over all
    positions and per offset bucket (``by_offset``, ``bebop.speculative.auto.tail.OFFSET_EDGES``), and the same
    per K of the steps that drafted them (``by_k``): a K's alphas lean on its own steps (``alphas``).
    Which tokens depth j drafts depends on K (a K = 1 run drafts depth 1 at every token, hard ones
    included; a K = 4 run where its steps start, after accepted runs or rejections): at offsets >= 8
    depth 1's alpha_RS was 0.75 / 0.94 / 0.87 / 0.97 under rs1 / rs2 / rs3 / rs4 (B = 64, T = 0.3).
    From one pool, a run at K = 1 forecast every deeper K too low and stayed at K = 1; ``replay`` (the
    chooser's, ``bebop.speculative.auto.replay``) forecasts each K where its own steps would start.
    """

    sums: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in RULES})
    weights: list[float] = field(default_factory=list)  # (J,) recorded positions per depth
    by_offset: list[Acceptance] = field(default_factory=list)  # the same per offset bucket (empty: never observed)
    by_k: dict[int, Acceptance] = field(default_factory=dict)  # the same per K of the drafting steps
    replay: Replay | None = None  # the model K does not move, replayed per K (``alphas``); the top table's only

    def _grow(self, depth: int) -> None:
        while len(self.weights) < depth:
            self.weights.append(0.0)
            for rule in RULES:
                self.sums[rule].append(0.0)

    def add(self, depth: int, weight: float, alpha_rs: float, alpha_to: float) -> None:
        """Adds ``weight`` positions at ``depth`` (1-based) whose alphas sum to alpha_rs, alpha_to."""
        self._grow(depth)
        self.weights[depth - 1] += weight
        self.sums["rs"][depth - 1] += alpha_rs
        self.sums["to"][depth - 1] += alpha_to

    def observe(self, log: EmissionLog, lengths: list[int], greedy: bool, age: float = 1.0) -> None:
        """Adds a call's kept draft positions (counterfactual alphas; at T = 0 whether each was accepted:
        both rules accept iff argmax q = argmax p, and the recorded alphas are T = 1 numbers). The
        tables of the K's that ran are first decayed by ``age`` (``decay``)."""
        pos = draft_positions(log, lengths)
        rs, to = (pos["accepted"], pos["accepted"]) if greedy else (pos["alpha_rs"], pos["alpha_to"])
        bucket = np.searchsorted(OFFSET_EDGES, pos["offset"], side="right")
        self._add_positions(pos["depth"], bucket, rs, to)
        if self.replay is not None:
            kept = log.kept(lengths)
            self.replay.add_positions(pos["depth"], kept.values[0], {"rs": rs, "to": to})
            self.replay.add_rows(completion_entropies(kept, lengths))
        for k in np.unique(pos["k"]).tolist():
            sel, own = pos["k"] == k, self.by_k.setdefault(k, Acceptance())
            own.decay(age)
            own._add_positions(pos["depth"][sel], bucket[sel], rs[sel], to[sel])

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
                          [sub.copy() for sub in self.by_offset], {k: t.copy() for k, t in self.by_k.items()},
                          self.replay.copy() if self.replay is not None else None)

    def to_state(self) -> dict:
        """The tables as JSON-able lists and dicts (not copies: dump them before the next call; ``from_state``
        reads them back)."""
        return {"sums": self.sums, "weights": self.weights, "by_offset": [sub.to_state() for sub in self.by_offset],
                "by_k": {str(k): t.to_state() for k, t in self.by_k.items()},
                "replay": self.replay.to_state() if self.replay is not None else None}

    @classmethod
    def from_state(cls, state: dict) -> Acceptance:
        """The table ``to_state`` wrote; ValueError when it does not fit (other depths, buckets or rules)."""
        weights = [float(w) for w in state["weights"]]
        sums = {r: [float(x) for x in state["sums"][r]] for r in RULES}
        by_offset = [cls.from_state(sub) for sub in state["by_offset"]]
        if any(len(v) != len(weights) for v in sums.values()) or len(by_offset) not in (0, len(OFFSET_EDGES) + 1):
            raise ValueError("acceptance tables of mismatched depths or offset buckets")
        replay = Replay.from_state(state["replay"]) if state.get("replay") is not None else None
        return cls(sums, weights, by_offset, {int(k): cls.from_state(t) for k, t in state["by_k"].items()}, replay)

    def decay(self, factor: float) -> None:
        """Older evidence weighs ``factor`` times less: all steps' and each offset bucket's. A K's own
        steps (``by_k``) age only in calls that run that K (``observe``'s ``age``): at B = 1 a call
        drafts ~5 steps, and a K an RL run only probes lost its deep alphas to the prior within a few
        calls (rs4's depth 3 at offsets >= 8 read 0.48-0.54 against 0.62 measured over 40 calls at
        T = 1; the run chose rs2 at 0.84x rs4)."""
        self.weights = [w * factor for w in self.weights]
        self.sums = {r: [s * factor for s in v] for r, v in self.sums.items()}
        for sub in self.by_offset:
            sub.decay(factor)
        if self.replay is not None:
            self.replay.decay(factor)

    def alphas(self, rule: str, k: int, bucket: int | None = None) -> list[float]:
        """alpha_1..alpha_K of a rule, each depth's mean shrunk toward the depth above it; with
        ``bucket``, that offset bucket's, each depth shrunk toward the all-offsets value.

        alpha_1 is depth 1's mean (0 when nothing was recorded). A deeper depth j with recorded
        weight w_j and alpha sum s_j gives alpha_j = (s_j + m alpha_{j-1}) / (w_j + m), m =
        PRIOR_POSITIONS: a depth seen a few times (a short probe at B = 1) leans on the one above
        it, a well-seen one speaks for itself, an unseen one repeats the one above. In a bucket,
        alpha_j = (s_j + m a_j) / (w_j + m), a_j the all-offsets alpha_j: the depth profile is not
        flat within a bucket (embedded task, rs K=4, B=64, offsets >= 8: 0.97, 0.74-0.80, 0.54-0.64,
        0.83 at T 0.3-1), and an unseen bucket (a one-shot call's later offsets) is the all-offsets one.
        Then, with ``replay``, the same toward K's alphas replayed on recent completions, weighted by
        the drafts the replay expects in the bucket (``bebop.speculative.auto.replay``): the pooled depths were
        read where the K's that ran started their steps, the replay reads where K's own would. Last,
        when steps ran at this K, the same again with that value as the prior and the K's own steps
        (in the bucket) as the evidence (``by_k``).

        Example: seen [0.8, 0.6] with 100 positions each -> alphas(rule, 3) ~ [0.8, 0.601, 0.601].
        """
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
        replayed = self.replay.alphas(rule, k, PRIOR_POSITIONS) if self.replay is not None else None
        if replayed is not None:  # NOTE: K's own step starts (``bebop.speculative.auto.replay``), where its completions reach
            alphas, drafts = (a[-1 if bucket is None else bucket].tolist() for a in replayed)
            out = [(w * a + PRIOR_POSITIONS * o) / (w + PRIOR_POSITIONS) for a, w, o in zip(alphas, drafts, out)]
        own = self.by_k.get(k)  # NOTE: the steps run at this K (class docstring), leaning on all steps'
        if own is not None:
            out = _shrunk(own.by_offset[bucket] if bucket is not None and own.by_offset else own, rule, out)
        return out

    def offset_alphas(self, rule: str, k: int) -> list[list[float]]:
        """``alphas`` of every offset bucket (``bebop.speculative.auto.tail.finished``): all alike when never observed."""
        return [self.alphas(rule, k, b) for b in range(len(OFFSET_EDGES) + 1)]


def _line(points: list[tuple[float, float, float]], drafting: bool = False) -> tuple[float, float]:
    """(a, b) of y = a + b x by weighted least squares over (x, y, weight) points, b >= 0.

    ``drafting``: a >= 0, and y proportional to x (a = 0) from a single x or where the fit's a came
    out below 0. Otherwise a single x gives y constant.

    Example: _line([(1, 3.0, 1.0), (3, 7.0, 1.0)]) -> (1.0, 2.0).
    """
    total = sum(w for _, _, w in points)
    mean_x, mean_y = sum(w * x for x, _, w in points) / total, sum(w * y for _, y, w in points) / total
    spread = sum(w * (x - mean_x) ** 2 for x, _, w in points)
    slope = max(0.0, sum(w * (x - mean_x) * (y - mean_y) for x, y, w in points) / spread) if spread else 0.0
    if drafting and (not spread or mean_y - slope * mean_x < 0):
        return 0.0, max(0.0, sum(w * x * y for x, y, w in points) / sum(w * x * x for x, _, w in points))
    return mean_y - slope * mean_x, slope


@dataclass
class StepCosts:
    """Seconds of engine decode steps by K (0 = plain), and of their drafting.

    step(K) = draft(K) + c_verify(K). draft(K) = d_0 + K c_draft, the drafting timed inside the
    steps: a line through the drafted depths' times (d_0 >= 0: the head's pass over the positions
    the last step left pending, paid once per step whatever K; at B = 64 here ~0.6 ms beside ~1.3 ms
    per chained step), through 0 when one depth was timed. c_verify(K) = step - draft(K) at the
    measured depths, linear in K between and past them (least squares weighted by each depth's
    timed steps, slope >= 0; constant when one depth was measured). A step at R rows and depth K
    costs scale(R, K) = 1 + gamma_K R times ``seconds`` (the batch's tail runs few rows): gamma_K
    fitted per depth on the tails of calls (``fit_rows``), as the cost of a row grows with the tokens
    a step runs per row (B = 16 here: gamma 0.007 plain, 0.012 / 0.014 / 0.023 at K = 1 / 2 / 4),
    and shrunk toward the other depths' (``gamma``). With one gamma for all, a chooser that had timed
    every setting over 10 calls priced a B = 16 step of rs2 at 9.6 ms (7.9 measured) and forecast rs2
    7% low, rs4 3% high at T = 0.3, where rs2 is the fastest; per depth, every forecast was within
    3.4% (B = 16, 64).

    Each depth's cost is the mean of its measurements (the median step of a block of steps),
    weighted by their timed steps. The costs are a probing call's own (``AutoChooser.restart``);
    with a shape (``use_shape``), each depth and drafting the call timed is its deep depth's cost
    times the ratio pooled over probes (``CostShape``).

    Example: steps of 9 ms at K=1 and 16 ms at K=4 with c_draft = 2 ms give c_verify = 6.67 + K/3 ms,
    so step(2) = 4 + 7.33 = 11.33 ms.
    """

    seconds: dict[int, float] = field(default_factory=dict)  # K -> seconds per decode step / scale(rows)
    draft_s: float | None = None  # c_draft, seconds per draft depth / scale(rows) (None: never timed)
    draft_fixed: float = 0.0  # d_0, seconds of drafting per step whatever K / scale(rows)
    weights: dict[int, float] = field(default_factory=dict)  # K -> timed steps behind ``seconds``
    measured: dict = field(default_factory=dict, repr=False)  # K or ("draft", K) -> [(median rows, median seconds, steps)]

    row_slope: dict[int, float] = field(default_factory=dict)  # K -> gamma_K, fitted (``gamma``)
    row_stats: dict = field(default_factory=dict, repr=False)  # K -> [n, sum R, sum s, sum R^2, sum R s]
    prefill_slope: float | None = None  # c_verify per extra depth from the prefill, / scale (``fit_prefill``)
    own: dict = field(default_factory=dict, repr=False)  # K or ("draft", K) -> this call's measured seconds / scale
    shape: dict = field(default_factory=dict, repr=False)  # the same -> (cost / shape_ref's, weight) at shape_rows
    shape_ref: int | None = None  # the depth ``shape``'s ratios are to (``CostShape``); None: no shape
    shape_rows: float = 0.0  # rows ``shape``'s ratios were measured at

    def scale(self, rows, k: int):
        """1 + gamma_K rows: the cost of a step at ``rows`` rows and depth k in the units of ``seconds``."""
        return 1.0 + self.gamma(k) * rows

    def gamma(self, k: int) -> float:
        """gamma_K: depth k's own fit shrunk toward the other depths' (``_gamma_prior``) with the weight of
        GAMMA_PRIOR_STEPS steps; without its own fit, the others'; 0 when no depth was fitted.

        A call's tail is ~10 steps, and one call's fit is noise: rs2's first whole call at B = 16, T = 1
        fitted 0.044 (0.012 over the grid's calls), its forecast fell from 2,879 to 2,573 tok/s (~3,300
        measured), and the run went back to rs4."""
        prior = self._gamma_prior(k)
        if k not in self.row_slope:
            return prior if prior is not None else 0.0
        if prior is None or k not in self.row_stats:
            return self.row_slope[k]
        steps = float(self.row_stats[k][0])
        return (steps * self.row_slope[k] + GAMMA_PRIOR_STEPS * prior) / (steps + GAMMA_PRIOR_STEPS)

    def _gamma_prior(self, k: int) -> float | None:
        """The other fitted depths' gamma at k: a line in K through the drafted depths' fits weighted by
        their steps, at least 0, when two or more drafted depths were fitted (for plain, k = 0, its K = 0
        point: a row's cost grows with the tokens a step runs for it, K + 1, plain's 1 included); else,
        for a drafted k, the one drafted fit, and otherwise the steps-weighted mean of the others; None
        when no other depth was fitted.

        NOTE: plain took the drafted depths' mean (0.011-0.015 against its own 0.005-0.006 at B = 16 and
        64), so a plain block timed on the batch's tail was priced dear at B rows: plain priced +19% at
        B = 64 when not held, +11% from the line (bench/README.md)."""
        others = [(j, g, float(self.row_stats[j][0]) if j in self.row_stats else 1.0)
                  for j, g in self.row_slope.items() if j != k]
        drafted = [o for o in others if o[0] >= 1]
        if len({j for j, _, _ in drafted}) > 1:
            a, b = _line(drafted)
            return max(0.0, a + b * k)
        known = drafted if k >= 1 and drafted else others
        total = sum(w for _, _, w in known)
        return sum(w * g for _, g, w in known) / total if known and total > 0 else None

    def fit_rows(self, k: int, step_times: list[tuple[int, float, float]]) -> None:
        """Adds depth k's steps to its row fit when ROW_FIT_STEPS or more ran over rows spanning half the
        most or more (a call's tail; 2 at least): gamma_K = b / a of
        the least squares a + b R over all such steps at depth k, in [0, 1]."""
        rows = np.array([r for r, _, _ in step_times], dtype=float)
        # NOTE: a call's tail, not a few steps a few rows apart: explored steps fitted gamma_2 = 0.059 at
        # B = 64, T = 1 (0.015 over whole calls) and priced rs2 27% low
        if len(rows) < ROW_FIT_STEPS or np.ptp(rows) < max(2.0, rows.max() / 2):
            return
        secs = np.array([s for _, s, _ in step_times])
        self.row_stats[k] = self.row_stats.get(k, 0.0) + np.array(
            [len(rows), rows.sum(), secs.sum(), rows @ rows, rows @ secs])
        n, sum_r, sum_s, sum_rr, sum_rs = self.row_stats[k]
        b = (sum_rs - sum_r * sum_s / n) / (sum_rr - sum_r * sum_r / n)
        a = (sum_s - b * sum_r) / n
        self.row_slope[k] = 0.0 if b <= 0 else (1.0 if a <= b else float(b / a))

    def to_state(self) -> dict:
        """The measurements as JSON-able lists (``from_state`` re-derives the rest)."""
        return {"measured": [[key if isinstance(key, int) else list(key), [list(e) for e in entries]]
                             for key, entries in self.measured.items()],
                "row_slope": {str(k): g for k, g in self.row_slope.items()},
                "row_stats": {str(k): stats.tolist() for k, stats in self.row_stats.items()},
                "prefill_slope": self.prefill_slope,
                "shape": {_key_name(key): list(v) for key, v in self.shape.items()}, "shape_ref": self.shape_ref,
                "shape_rows": self.shape_rows}

    @classmethod
    def from_state(cls, state: dict) -> StepCosts:
        """The costs ``to_state`` wrote; ValueError when an entry does not fit."""
        measured = {}
        for key, entries in state["measured"]:
            key = int(key) if not isinstance(key, list) else ("draft", int(key[1]))
            measured[key] = [tuple(float(x) for x in e) for e in entries]
            if any(len(e) != 3 for e in measured[key]):
                raise ValueError(f"a cost measurement of depth {key} is not (rows, seconds, steps)")
        stats = {int(k): np.array(v, dtype=float) for k, v in state["row_stats"].items()}
        if any(v.shape != (5,) for v in stats.values()):
            raise ValueError("row statistics are not 5 sums")
        costs = cls(measured=measured, row_slope={int(k): float(g) for k, g in state["row_slope"].items()},
                    row_stats=stats, prefill_slope=state["prefill_slope"],
                    shape={_name_key(n): (float(r), float(w)) for n, (r, w) in state.get("shape", {}).items()},
                    shape_ref=state.get("shape_ref"), shape_rows=float(state.get("shape_rows", 0.0)))
        costs._refresh()
        return costs

    def excess(self, k: int, step_time: tuple[int, float, float]) -> float:
        """Seconds a call's first step (at depth k) took beyond a step's predicted cost, at least 0."""
        base = self.step_seconds(k)
        return max(0.0, step_time[1] - base * self.scale(step_time[0], k)) if base else 0.0

    def observe(self, k: int, step_times: list[tuple[int, float, float]]) -> None:
        """Learns from a call's ``Completions.step_times`` at depth k (0 = plain)."""
        if not step_times:
            return
        self.fit_rows(k, step_times)
        self.measured.setdefault(k, []).append((statistics.median(r for r, _, _ in step_times),
                                                statistics.median(s for _, s, _ in step_times), len(step_times)))
        drafted = [(r, d) for r, _, d in step_times if d > 0]
        if k >= 1 and drafted:
            self.measured.setdefault(("draft", k), []).append(
                (statistics.median(r for r, _ in drafted), statistics.median(d for _, d in drafted), len(drafted)))
        self._refresh()

    def _refresh(self) -> None:
        """``seconds``, ``weights`` and the drafting line from the measurements, all re-read at the newest
        gamma; with a ``shape`` (``use_shape``), every key it holds is depth shape_ref's cost times its ratio."""
        gammas = {k: self.gamma(k) for k in {_depth(key) for key in self.measured}}  # NOTE: once per depth
        weights = {}
        for key, entries in self.measured.items():
            total = sum(w for _, _, w in entries)
            gamma = gammas[_depth(key)]
            self.own[key], weights[key] = sum(w * s / (1.0 + gamma * r) for r, s, w in entries) / total, total
        values = dict(self.own)
        if self.shape_ref in self.own:
            base = self.at_rows(self.shape_ref, self.shape_rows)
            for key, (ratio, weight) in self.shape.items():
                values[key] = ratio * base / self.scale(self.shape_rows, _depth(key))
                weights.setdefault(key, weight)
        drafts = [(key[1], v, weights[key]) for key, v in values.items() if isinstance(key, tuple)]
        self.seconds = {k: v for k, v in values.items() if not isinstance(k, tuple)}
        self.weights = {k: weights[k] for k in self.seconds}
        if drafts:
            self.draft_fixed, self.draft_s = _line(drafts, drafting=True)

    def at_rows(self, key, rows: float) -> float:
        """This call's own measured seconds of ``key`` (a depth, or ("draft", K)) at ``rows`` rows."""
        return self.own[key] * self.scale(rows, _depth(key))

    def use_shape(self, ratios: dict, ref: int, rows: float) -> None:
        """Prices every key of ``ratios`` (key -> (cost / depth ref's, weight), ``CostShape.ratios``) from
        depth ref's own cost, at ``rows`` rows."""
        self.shape, self.shape_ref, self.shape_rows = ratios, ref, rows
        self._refresh()

    def draft_seconds(self, k: int) -> float:
        """draft(K) = d_0 + K c_draft (0 for plain steps)."""
        return self.draft_fixed + k * self.draft_s if k else 0.0

    def verify_seconds(self, k: int) -> float | None:
        """c_verify(K), or None without a timed draft step and a measured depth.

        A line through the measured depths (least squares weighted by their timed steps, slope >= 0;
        two depths: the line through them); with one drafted depth, the
        plain step is the line's K = 0 point (a verify pass over one token per row: on the same line
        within ~0.4 ms here, bench/auto.py), else the slope comes from ``prefill_slope``, else 0.
        Never below a plain step: a verify pass runs the plain step's forward over K + 1 tokens a row.
        """
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
        # NOTE: B = 16, K = 3 and 4 timed (K = 4 on fewer steps): the line through them priced a K = 1
        # step at 4.2-5.2 ms against 7.3 measured (a plain step: 5.6 ms)
        return max(line, self._plain_floor(k))

    def _plain_floor(self, k: int) -> float:
        """A plain step's seconds in depth k's units (``scale``) at the rows plain steps were timed at; 0
        when never timed."""
        if 0 not in self.seconds:
            return 0.0
        rows = statistics.median(r for r, _, _ in self.measured[0]) if self.measured.get(0) else 0.0
        return self.seconds[0] * self.scale(rows, 0) / self.scale(rows, k)

    def fit_prefill(self, k: int, rows: int, prompt_len: float, prefill_s: float) -> None:
        """``prefill_slope`` from a prefill of ``prompt_len`` tokens per row beside verify steps at depth k.

        The prefill is a forward over prompt_len tokens per row, a verify pass one over k + 1: the
        difference over the extra tokens estimates the verify cost of one more draft depth (it also
        holds the head's prefill, so it errs high: toward shallower K). Unchanged when it cannot say.
        """
        verify = self.verify_seconds(k) if k in self.seconds else None
        if verify is None or prompt_len <= k + 1:
            return
        self.prefill_slope = max(0.0, (prefill_s / self.scale(rows, k) - verify) / (prompt_len - (k + 1)))

    def step_seconds(self, k: int) -> float | None:
        """Predicted seconds of a step at depth k (0 = plain), or None when nothing predicts it.

        A plain step is only ever measured: c_verify(K) does not bound it (a verify step also
        verifies, logs and samples K+1 positions; at B = 64 here c_verify(1) ~ 1.3 plain steps).
        """
        if k in self.seconds:
            return self.seconds[k]
        if k == 0:
            return None
        verify = self.verify_seconds(k)
        return None if verify is None else verify + self.draft_seconds(k)


def _depth(key) -> int:
    """The depth of a cost key: K, or ("draft", K)."""
    return key[1] if isinstance(key, tuple) else key


def _key_name(key) -> str:
    return f"draft{key[1]}" if isinstance(key, tuple) else str(key)


def _name_key(name: str):
    return ("draft", int(name[5:])) if name.startswith("draft") else int(name)


@dataclass
class CostShape:
    """What each step costs relative to the deep probe's step at the same rows, pooled over probes per
    batch size: a probe prices its settings from one or two timed steps each, and a step's time moves
    from step to step by 10-17% (sd of log, within a call; B = 1 and 16), so one probe's ratios are noise.

    Each probe adds log(cost / deep step's cost) of every key it timed (a depth's step, a depth's
    drafting: ``StepCosts.measured``), older probes' weight decayed by SHAPE_DECAY. The probe's own
    deep step then prices every key it timed (``StepCosts.use_shape``; the settings it did not time
    follow from those, a line in K): the level is the moment's, the ratios are the memory's. A ratio
    does not move with the machine's speed, so probes at other speeds pool.

    Why: at B = 16, T = 0.7 a probe priced rs4 / rs2 with a sd of 6-9% (copies of one chooser, 40
    probes; true ratio 0.98) from one plain and one rs4 step, and the step costs it read ranged 8-16
    ms for one K = 4 step (13.7 ms median over calls). Pooled: 1-2.5% (copies of a warm chooser, B = 1
    and 16), and over an RL-style chooser's probes bench/auto_ab.py's price noise fell from 0.083 to
    0.052 (median of 6 groups; at B = 16 halved), throughput within that bench's noise; bench/auto.py's
    B = 16 choosers held rs2 after their first probes (bench/README.md).
    """

    sums: dict[int, dict[str, list[float]]] = field(default_factory=dict)  # batch -> key -> [sum log ratio, weight]

    def add(self, batch: int, costs: StepCosts, ref: int) -> None:
        """Decays the ratios at ``batch`` rows, then adds log(cost / depth ref's cost) of every key ``costs``
        timed itself (``StepCosts.own``), at ``batch`` rows."""
        table = self.sums.setdefault(batch, {})
        for entry in table.values():
            entry[0] *= SHAPE_DECAY
            entry[1] *= SHAPE_DECAY
        if ref not in costs.own:
            return
        base = costs.at_rows(ref, batch)
        for key in costs.own:
            value = costs.at_rows(key, batch)
            if key != ref and value > 0 and base > 0:
                entry = table.setdefault(_key_name(key), [0.0, 0.0])
                entry[0] += math.log(value / base)
                entry[1] += 1.0

    def ratios(self, batch: int, keys=None) -> dict:
        """key -> (geometric-mean cost / the deep step's, weight) at ``batch`` rows, of ``keys`` (default all)."""
        return {_name_key(name): (math.exp(total / weight), weight)
                for name, (total, weight) in self.sums.get(batch, {}).items()
                if weight > 0 and (keys is None or _name_key(name) in keys)}

    def to_state(self) -> dict:
        return {str(batch): {name: list(entry) for name, entry in table.items()} for batch, table in self.sums.items()}

    @classmethod
    def from_state(cls, state: dict) -> CostShape:
        """The shape ``to_state`` wrote; ValueError when an entry is not [sum, weight]."""
        sums = {int(batch): {str(name): [float(x) for x in entry] for name, entry in table.items()}
                for batch, table in state.items()}
        if any(len(e) != 2 for table in sums.values() for e in table.values()):
            raise ValueError("a cost ratio is not [sum of log ratio, weight]")
        return cls(sums)


def predict(mode: str, k: int, acceptance: Acceptance, costs: StepCosts, rows: float) -> float:
    """Predicted tokens/s of (mode, K) for ``rows`` decoding rows; 0 when the costs cannot say.

    Example: rs, K=2, alpha_RS = [0.5, 0.5], 0.01 s per step, 4 rows -> 4 * 1.75 / 0.01 = 700.
    """
    seconds = costs.step_seconds(0 if mode == "none" else k)
    if not seconds:
        return 0.0
    tokens = 1.0 if mode == "none" else 1.0 + expected_accepted(acceptance.alphas(mode, k))
    return rows * tokens / (seconds * costs.scale(rows, 0 if mode == "none" else k))


@dataclass
class Decision:
    """The chosen setting, its prediction and every candidate's."""

    mode: str
    speculate_k: int  # 0 for none
    predicted_tok_s: float
    predictions: dict[str, float]  # "none", "to3", "rs1", ... -> predicted tokens/s
    rows: float = 1.0  # decoding rows the predictions are for (tokens/s scales with them)
    measured_tok_s: float = float("nan")  # tokens/s of the steps decoded at the chosen setting
    probed: bool = True  # the call probed settings and decided (else: it kept the last probe's decision)
    confirmed: bool = True  # held until the next scheduled probe (else: the next call probes, ``AutoChooser.settle``)

    def to_metrics(self) -> dict:
        return {"auto/mode": self.mode, "auto/speculate_k": self.speculate_k,
                "auto/predicted_tok_s": self.predicted_tok_s, "auto/probed": self.probed,
                "auto/confirmed": self.confirmed}


def config_name(mode: str, k: int) -> str:
    return mode if mode == "none" else f"{mode}{k}"


class AutoChooser:
    """The run's acceptance, cost and length models; ``choose`` picks the best candidate.

    The acceptance evidence (decayed by DECAY each call) and the completion lengths (the newest
    ``bebop.speculative.auto.tail.HISTORY``) are kept across calls; the step costs are a probe's own
    (``restart``), their ratios across depths pooled over probes (``CostShape``). Measured side by
    side (bench/README.md; RL-style choosers beside fixed settings, B = 16 and 64, T = 0.3 and 1, 30
    calls): absolute step costs carried across calls, corrected by a running
    calibration, re-timed by explored blocks and re-priced between probes, ran 1.5 points of
    throughput behind probes that time afresh with a choice held in between (0.961 against 0.976
    of the best, 3 runs), and carrying the lengths as well as the acceptance added 0.75 points (2
    runs). A setting timed in another call was timed at another speed of the machine (its phases
    move a call's steps by ~18%), and the settings a run did not hold were priced 10-12% dear.
    """

    def __init__(self, confirm: bool = True, replay: bool = True, pool_costs: bool = True) -> None:
        self.acceptance = Acceptance(replay=Replay() if replay else None)
        self.costs = StepCosts()
        self.shape = CostShape() if pool_costs else None  # the step costs' ratios across probes (``CostShape``)
        self.lengths = Lengths()
        self.prefill_s: float = 0.0  # seconds of the latest call's prefill
        self.held: Decision | None = None  # the latest probe's decision, kept by the calls until the next probe
        self.confirm = confirm  # a setting first chosen is checked by a probe in the next call (``settle``)
        self.tried: set[str] = set()  # the settings decisions chose: each ran the rest of a call at least

    def restart(self) -> None:
        """A probe's start: forgets the step costs (kept: the acceptance evidence, the completion lengths
        and the held decision; ``prefill_s`` is the call's own once it ends, ``end_call``)."""
        self.costs = StepCosts()

    def to_state(self) -> dict:
        """The chooser's state, JSON-able: a profile (``bebop.speculative.auto.profile``) carries it across calls."""
        held = dataclasses.asdict(self.held) if self.held is not None else None
        return {"acceptance": self.acceptance.to_state(), "costs": self.costs.to_state(),
                "lengths": self.lengths.seen, "prefill_s": self.prefill_s,
                "held": held and {k: v if v == v else None for k, v in held.items()},  # NOTE: nan is not JSON
                "confirm": self.confirm, "tried": sorted(self.tried),
                "shape": self.shape.to_state() if self.shape is not None else None}

    @classmethod
    def from_state(cls, state: dict) -> AutoChooser:
        """The chooser ``to_state`` wrote; KeyError, TypeError or ValueError when the state does not fit."""
        shape = state.get("shape", {})  # NOTE: a profile saved before cost pooling starts a shape
        chooser = cls(confirm=bool(state["confirm"]), pool_costs=shape is not None)
        chooser.shape = CostShape.from_state(shape) if shape is not None else None
        chooser.tried = {str(name) for name in state["tried"]}
        chooser.acceptance = Acceptance.from_state(state["acceptance"])
        if chooser.acceptance.replay is None:  # NOTE: a profile saved before the replay model starts one
            chooser.acceptance.replay = Replay()
        chooser.costs = StepCosts.from_state(state["costs"])
        chooser.lengths = Lengths([int(n) for n in state["lengths"]])
        chooser.prefill_s = float(state["prefill_s"])
        held = state["held"]
        if held is not None:
            fields = {f.name for f in dataclasses.fields(Decision)}
            if set(held) != fields:
                raise ValueError(f"a held decision has fields {sorted(held)}, not {sorted(fields)}")
            chooser.held = Decision(**{k: math.nan if v is None else v for k, v in held.items()})
            chooser.held.predictions = {str(n): float(v) for n, v in chooser.held.predictions.items()}
        return chooser

    def holds(self, options: list[tuple[str, int]]) -> bool:
        """Whether a call between probes can keep the held decision: one was made, no probe has to
        confirm it (``settle``), and the spec allows it."""
        return self.held is not None and self.held.confirmed and (self.held.mode, self.held.speculate_k) in options

    def settle(self, decision: Decision) -> None:
        """Holds a probe's decision. With ``confirm``, a decision for a setting no decision chose before
        is held for one call only: the next call probes again, with the acceptance of a whole call at
        that setting (a chain of new settings confirms each; at most one extra probe per setting).

        Why: a K a run has not drafted whole calls with is forecast from the other K's steps, and
        which tokens depth 1 drafts moves with K (``Acceptance``): at B = 64 a K = 1 call accepted
        0.82-0.85 at depth 1 at offsets >= 8 against 0.95-0.98 forecast from K = 2 and 4 steps, and
        RL-style runs that moved to rs1 held it for ten calls at 0.89-0.93x rs2 (bench/README.md).
        A call at the new setting is the evidence the probe's few steps cannot give."""
        name = config_name(decision.mode, decision.speculate_k)
        decision.confirmed = not (self.confirm and name not in self.tried)
        self.tried.add(name)
        self.held = decision

    def price_from_shape(self, batch: int, ref: int) -> None:
        """Prices what this call timed from depth ref's cost timed in it and the shape's ratios (``CostShape``);
        the rest as before, from those (a line in K)."""
        if self.shape is not None:
            self.costs.use_shape(self.shape.ratios(batch, set(self.costs.measured)), ref, batch)

    def pool_probe(self, batch: int, ref: int) -> None:
        """Adds the probe's ratios to the shape, then prices from it (``CostShape.add``)."""
        if self.shape is not None:
            self.shape.add(batch, self.costs, ref)
            self.price_from_shape(batch, ref)

    def observe(self, result: Completions, mode: str, greedy: bool) -> None:
        """Learns from a call decoded at a fixed setting what a call between probes teaches: its alphas,
        when it drafted (older evidence decayed by DECAY, as ``generate_auto`` does), and its
        completion lengths. Its step times are not kept: the next probe times its settings afresh."""
        self.acceptance.decay(DECAY)
        if mode != "none" and result.log is not None:
            self.acceptance.observe(result.log, result.lengths, greedy, age=DECAY)
        self.lengths.add(result.lengths)

    def end_call(self, result: Completions, first_step: tuple[int, tuple] | None) -> None:
        """A call's completion lengths and prefill: its seconds plus what its first step (depth, step
        time; None: no step) took beyond a step's cost (``StepCosts.excess``)."""
        self.lengths.add(result.lengths)
        self.prefill_s = result.prefill_seconds + (self.costs.excess(*first_step) if first_step else 0.0)

    def rates(self, options: list[tuple[str, int]], rows: Rows, prefill_s: float = 0.0) -> dict[str, float]:
        """Tokens/s of each (mode, K) over the rest of ``rows``, the tail priced
        (``bebop.speculative.auto.tail.call_rates``, alphas per offset bucket); 0 where the costs cannot say."""
        names = [config_name(m, k) for m, k in options]
        bases = [self.costs.step_seconds(0 if m == "none" else k) for m, k in options]
        known = [i for i, b in enumerate(bases) if b]
        out = dict.fromkeys(names, 0.0)
        if known:
            alphas = [[] if options[i][0] == "none" else self.acceptance.offset_alphas(*options[i]) for i in known]
            slopes = [self.costs.gamma(0 if options[i][0] == "none" else options[i][1]) for i in known]
            found = call_rates(rows, alphas, np.array([bases[i] for i in known]), np.array(slopes), prefill_s)
            out.update({names[i]: float(r) for i, r in zip(known, found)})
        return out

    def rate(self, mode: str, k: int, rows: Rows, prefill_s: float = 0.0) -> float:
        """``rates`` of one setting."""
        return self.rates([(mode, k)], rows, prefill_s)[config_name(mode, k)]

    def fresh_rows(self, batch: int, max_new: int) -> Rows:
        """The rows of a call about to start (``Lengths.fresh``): each emits PREFILL_TOKENS in the prefill,
        and a completion seen to end there runs no decode step."""
        return self.lengths.fresh(batch, PREFILL_TOKENS, max_new)

    def predict_call(self, mode: str, k: int, batch: int, max_new: int) -> float:
        """Tokens/s of a whole call of ``batch`` fresh rows at (mode, K), prefill included (its seconds
        and the first token of every row)."""
        rows = self.fresh_rows(batch, max_new)
        rate = self.rate(mode, k, rows, self.prefill_s)  # the decode steps' tokens over the call's seconds
        if not rate:
            return 0.0
        decoded = rows.tokens()
        return (decoded + PREFILL_TOKENS * batch) * rate / decoded

    def shallow_could_win(self, options: list[tuple[str, int]], rows: float) -> int | None:
        """The shallower K worth probing after the deepest: the drafted depth below the deepest with the
        highest predicted tokens/s, when that beats the deepest's; None when none does. With one
        drafted depth measured, c_verify's slope is the prefill's (``StepCosts.fit_prefill``), which
        errs toward shallower K, so "beats" here means "could beat"."""
        rule = probe_rule(options)
        depths = sorted(k for m, k in options if m == rule)
        if len(depths) < 2:
            return None
        rates = {k: predict(rule, k, self.acceptance, self.costs, rows) for k in depths}
        best = max(depths[:-1], key=rates.get)
        return best if rates[best] > rates[depths[-1]] else None

    def choose(self, options: list[tuple[str, int]], rows: float, tail: Rows | None = None) -> Decision:
        """The candidate with the highest predicted tokens/s (the first of equals).

        With ``tail``, the rest of the call (its active rows and what they have left: ``Lengths.rows``
        mid-call, ``fresh_rows`` before it) is priced with its tail (``rate``); without, ``rows`` (1 +
        E[L]) / step cost.
        """
        if tail is None:
            predictions = {config_name(m, k): predict(m, k, self.acceptance, self.costs, rows) for m, k in options}
        else:
            predictions = self.rates(options, tail)
        mode, k = max(options, key=lambda c: predictions[config_name(*c)])
        return Decision(mode, k, predictions[config_name(mode, k)], predictions, rows)


def probe_rule(options: list[tuple[str, int]]) -> str | None:
    """The rule of drafted probe steps: ``rs`` when allowed (its steps record both alphas), else ``to``."""
    modes = {m for m, _ in options if m != "none"}
    return "rs" if "rs" in modes else ("to" if modes else None)


def _block(decoder: Decoder, chooser: AutoChooser, setting, mode: str, k: int, steps_at_least: int,
           positions: int = 0) -> list[tuple[int, float, float]]:
    """Decodes at (mode, K) for ``steps_at_least`` steps, more until ``positions`` rows were decoded, and
    times them (``StepCosts.observe``). A drafted block's first step is not timed (it also feeds the
    head what was left pending: the prompt after the prefill, every plain step's position after plain
    steps) unless it is the block's only step; plain steps run no head and are all timed."""
    decoder.set_spec(setting(mode, k))
    steps = []
    while decoder.num_active and (len(steps) < steps_at_least or sum(r for r, _, _ in steps) < positions):
        steps.append(decoder.step())
    if steps:
        chooser.costs.observe(k, steps if k == 0 or len(steps) < 2 else steps[1:])
    return steps


def _probe(decoder: Decoder, chooser: AutoChooser, options, setting, greedy: bool, prompt_len: float):
    """The probe's steps -> its first step: (depth, step time) of the call's first drafted step, else
    of its first step (None: no step); its excess over a step's cost is the head's prefill
    (``StepCosts.excess``).

    0. One plain step first when plain decoding is allowed: the call's first step, so nothing pending
       inflates it; plain's cost and the verify line's K = 0 point.
    1. PROBE_STEPS at the deepest K (``probe_rule``), more until PROBE_POSITIONS rows were drafted
       for: both alphas at every depth, c_draft, c_verify(K).
    2. PROBE_STEPS at the shallower K predicted best, when it could win (``shallow_could_win``): a
       second depth for the verify line.
    """
    firsts: list[tuple[int, tuple[int, float, float]]] = []  # (depth, first step) of each block

    def run(mode: str, k: int, steps_at_least: int = PROBE_STEPS, positions: int = 0) -> None:
        steps = _block(decoder, chooser, setting, mode, k, steps_at_least, positions)
        if steps:
            firsts.append((k, steps[0]))

    rule = probe_rule(options)
    depths = sorted(k for m, k in options if m != "none")
    if ("none", 0) in options and len(options) > 1 and decoder.num_active:
        run("none", 0, steps_at_least=1)
    if rule is not None and decoder.num_active:
        run(rule, depths[-1], positions=PROBE_POSITIONS)
        chooser.acceptance.observe(decoder.runner.log, [len(t) for t in decoder.runner.outputs], greedy,
                                   age=DECAY)  # NOTE: only the deep probe's positions
        chooser.costs.fit_prefill(depths[-1], len(decoder.prompt_ids), prompt_len, decoder.prefill_seconds)
        chooser.price_from_shape(len(decoder.prompt_ids), depths[-1])
    if rule is not None and decoder.num_active:
        shallow = chooser.shallow_could_win(options, max(decoder.num_active, 1))
        if shallow is not None:
            run(rule, shallow)
    return next((f for f in firsts if f[0] > 0), firsts[0] if firsts else None)


def generate_auto(
    model,
    tokenizer,
    prompts: list[str] | list[list[int]],
    *,
    mtp=None,
    sampling: SamplingParams = SamplingParams(),
    spec: SpecConfig = SpecConfig(AUTO, AUTO),
    seed: int = 0,
    step: int = 0,
    row_ids: list[int] | None = None,
    chooser: AutoChooser | None = None,
    probe: bool = True,
) -> tuple[Completions, Decision]:
    """``generate`` with the mode and/or K chosen within the call: probe steps, a decision, the rest.

    Args:
        model, tokenizer, prompts, mtp, sampling, seed, step, row_ids: as for ``generate``.
        spec: mode and/or speculate_k ``"auto"``; the other fields as for ``generate``.
        chooser: the run's models (RL keeps one across steps); None: a fresh one for this call only,
            which learns nothing after its decision (a one-shot call: no later call reads it).
        probe: probe settings first (``_probe``) from fresh step costs (``AutoChooser.restart``),
            then decide; False keeps the chooser's last decision (RL
            between probes: no probe step, no pricing), or probes when it has none the spec allows
            or that decision awaits a confirming probe (``AutoChooser.settle``).

    Returns:
        ``(result, decision)``: the completions (every probe token kept) with the statistics of the
        whole call, and the decision with its prediction and the tokens/s measured after it.
    """
    check_auto_spec(spec)
    options = candidates(spec)
    max_k = max(k for _, k in options)
    if mtp is None and max_k:
        raise BebopError(f"mode {spec.mode!r} needs an MTP head (--mtp)")
    private = chooser is None
    # NOTE: a one-shot chooser replays nothing: it has only this call's first tokens, and the replay's
    # ~1.7 ms a decision (8 settings) would be ~3% of a B = 1 call
    chooser = chooser if chooser is not None else AutoChooser(replay=False)
    chooser.acceptance.decay(DECAY)
    greedy = sampling.temperature == 0
    setting = (lambda mode, k: dataclasses.replace(spec, mode=mode, speculate_k=max(k, 1)))
    probe = probe or not chooser.holds(options)
    if probe:
        chooser.restart()
        prior = chooser.acceptance.copy()  # the evidence of earlier calls (the deep probe adds to a copy)
        rule = probe_rule(options)
        decision, first = None, (rule, max_k) if rule is not None else options[0]
    else:
        decision = dataclasses.replace(chooser.held, probed=False, measured_tok_s=math.nan)
        first = (decision.mode, decision.speculate_k)
    # NOTE: a call keeping the held decision never switches: room for its own K only (for rs2 at B = 16 room for
    # K = 4 cost 1.3% a call; a held plain call runs no head at all, as a plain call does)
    depth = max_k if probe else decision.speculate_k
    decoder = Decoder(model, tokenizer, prompts, mtp=mtp if depth else None, sampling=sampling, spec=setting(*first),
                      seed=seed, step=step, row_ids=row_ids, max_speculate_k=depth, time_drafts=probe)
    first_step = None
    if probe:
        prompt_len = statistics.fmean(len(p) for p in decoder.prompt_ids)
        first_step = _probe(decoder, chooser, options, setting, greedy, prompt_len)
        if probe_rule(options) is not None:
            chooser.pool_probe(len(decoder.prompt_ids), max_k)
        tail = chooser.lengths.rows(decoder.active_lengths(), sampling.max_new_tokens) if decoder.num_active else None
        decision = chooser.choose(options, rows=max(decoder.num_active, 1), tail=tail)
        decoder.set_spec(setting(decision.mode, decision.speculate_k))
    elif decoder.num_active:  # NOTE: the first step also feeds the head the prompt: priced as prefill
        first_step = (decision.speculate_k, decoder.step())
    start, before, rest = time.perf_counter(), decoder.num_tokens(), []
    while decoder.num_active:
        rest.append(decoder.step())
    if rest:
        decision.measured_tok_s = (decoder.num_tokens() - before) / max(time.perf_counter() - start, 1e-9)
    result = decoder.result()
    if private:  # NOTE: no later call reads this chooser: learning from the call would only add ~0.5 ms (B = 16)
        return result, decision
    if probe:
        chooser.costs.observe(decision.speculate_k, rest)
        chooser.acceptance = prior  # every drafted position of the call, once (not the probe's twice)
        chooser.settle(decision)
    chooser.acceptance.observe(result.log, result.lengths, greedy, age=DECAY)
    chooser.end_call(result, first_step)
    return result, decision
