"""Automatic choice of the verification mode and depth K (``--mode auto``, ``--speculate-k auto``).

Terms (K = speculation depth, R = rows decoding, p the target's distribution, q the draft's):
    alpha_j     acceptance at draft depth j given drafts 1..j-1 were accepted. Estimated by the mean
                of the counterfactual alpha_RS = sum min(p_j, q_j) and alpha_TO = p_j(argmax q_j) that
                the engine records at every kept draft position (``bebop.spec.stats``), whichever mode
                ran; at T = 0 by the accepted / reached counts (both rules are then greedy matching).
    E[L]        expected accepted drafts per verify step, sum_{j<=K} prod_{i<=j} alpha_i (arXiv
                2606.12370 Eq. 12; Leviathan et al. 2023); a verify step emits 1 + E[L] tokens.
    step cost   seconds of one engine decode step: plain_s for ``none``; K c_draft + c_verify(K) for
                ``to``/``rs``, from steps and their drafting timed by the engine (``StepCosts``).
    predicted   tokens/s of the rest of the call, its tail priced (``bebop.spec.tail``): the rows'
                remaining tokens drawn from the run's completion lengths, the steps each row needs at
                1 + L tokens a step, every step at the cost of its active rows, the call lasting until
                its longest row ends; times a per-family calibration (``AutoChooser``). Without the
                rows' state (``none_could_win``): R (1 + E[L]) / step cost (``none``: R / plain_s).

``generate_auto`` runs one engine call (``bebop.spec.engine.Decoder``) that switches settings
between decode steps, every token kept: a probe (``_probe``: steps at the deepest K; then plain
steps if plain decoding could win, else steps at a shallower K if one could), then the rest at the
setting with the highest predicted tokens/s. A setting that cannot win is not probed, so a call whose
best is the deepest K pays nothing for the probe. An RL run (``bebop.rollout``) probes every
``auto_every`` steps and, in between, re-decides at every step from what the earlier calls measured
(``probe=False``: no probe steps); it updates its models from every call.

Exactness: each step is an exact step of its setting, drawn from its rows' randomness at a counter
no other step uses, and the setting of a step depends only on the steps before it (and on
timings); each token is therefore drawn from p given its prefix whatever was chosen, and at T = 0
every step is greedy.

Deviations from the paper's speedup formula:
    1) Costs are whole engine decode steps (drafting, verify forward, verification, bookkeeping) as
       the engine times them (``GenerationResult.step_times``), not forwards alone: the overhead
       around the forwards decides the choice on a small model. c_verify(K) is what a step costs
       besides its drafting, a line in K (``StepCosts.verify_seconds``). ``to`` and ``rs`` share
       the costs (they differ only in sampling drafts from q).
    2) alpha_TO recorded while ``rs`` runs (and alpha_RS while ``to`` runs) is measured on the other
       rule's accepted prefixes, a small bias at depths >= 2.
    3) A depth with few recorded positions leans on the depth above it (``Acceptance.alphas``).
    4) The tail is priced from the completion lengths of earlier calls; a run's first call has none,
       so its rows are assumed to run to max_new_tokens (no tail: an overestimate, reported by
       ``bench/auto.py``). The calibration is learned against the tokens the rows really had left,
       so it corrects the cost and acceptance models only.
    5) The probe steps run settings that may be slower than the chosen one: the price of a
       one-shot call (``bebop generate``); an RL run pays it once every ``auto_every`` steps.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from bebop.config import AUTO, AUTO_MAX_K
from bebop.spec.engine import Decoder, GenerationResult, SamplingParams, SpecConfig
from bebop.spec.stats import SpecStats
from bebop.spec.tail import SCENARIOS, Lengths, call_rate
from bebop.utils.io import BebopError

PROBE_STEPS = 2  # decode steps of each probed setting: enough to time a step, few enough to cost little
# NOTE: a completion's first tokens are its least predictable (the embedded task's opener: alpha_RS ~0.1
# at depth 1 at T = 0.3, ~0.9 later), so a B = 1 probe of 2 steps mistakes them for the whole call.
PROBE_POSITIONS = 8  # rows x steps of the deep probe at least: its alphas' evidence
PRIOR_POSITIONS = 4.0  # weight of depth j-1's alpha in depth j's estimate (``Acceptance.alphas``)
DECAY = 0.9  # weight kept by older acceptance evidence at each call (RL: the policy drifts; ~10 calls of memory)
MIN_CALIBRATION_STEPS = 4  # fewer steps after a decision do not calibrate: the last, partial step dominates
CALIBRATION = 0.3  # weight of the newest log(measured / predicted) in the running calibration (from 0)
TAIL_SEED = 0  # seed of the remaining-length draws (bebop.spec.tail): the same for every setting
RULES = ("rs", "to")  # acceptance rules, named as the modes that use them


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
    if spec.mode not in ("none", "to", "rs", AUTO):
        raise BebopError(f"unknown mode {spec.mode!r}; choose one of none, to, rs, auto")
    k = spec.speculate_k
    if k != AUTO and (not isinstance(k, int) or isinstance(k, bool) or k < 1):
        raise BebopError(f"speculate_k must be an integer >= 1 or 'auto', got {k!r}")


def expected_accepted(alphas: list[float]) -> float:
    """E[L] = sum_j prod_{i<=j} alpha_i.

    Example: expected_accepted([0.5, 0.5]) = 0.5 + 0.25 = 0.75.
    """
    total, prod = 0.0, 1.0
    for a in alphas:
        prod *= a
        total += prod
    return total


@dataclass
class Acceptance:
    """Running per-depth acceptance of both rules: weighted sums of alpha and their weights."""

    sums: dict[str, list[float]] = field(default_factory=lambda: {r: [] for r in RULES})
    weights: list[float] = field(default_factory=list)  # (J,) recorded positions per depth

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

    def observe(self, stats: SpecStats, greedy: bool) -> None:
        """Adds a call's kept draft positions (counterfactual alphas; accept counts at T = 0)."""
        if greedy:  # both rules accept iff argmax q = argmax p; the recorded alphas are T=1 numbers
            reached = [sum(stats.accept_length_hist[j:]) for j in range(stats.speculate_k)]
            for j, (n, a) in enumerate(zip(reached, stats.accepted_per_pos)):
                if n:
                    self.add(j + 1, n, a, a)
            return
        arrays = stats.token_arrays()
        for j in range(1, stats.speculate_k + 1):
            sel = arrays["position"] == j
            if sel.any():
                self.add(j, float(sel.sum()), float(arrays["alpha_rs"][sel].sum()), float(arrays["alpha_to"][sel].sum()))

    def decay(self, factor: float) -> None:
        self.weights = [w * factor for w in self.weights]
        self.sums = {r: [s * factor for s in v] for r, v in self.sums.items()}

    def alphas(self, rule: str, k: int) -> list[float]:
        """alpha_1..alpha_K of a rule, each depth's mean shrunk toward the depth above it.

        alpha_1 is depth 1's mean (0 when nothing was recorded). A deeper depth j with recorded
        weight w_j and alpha sum s_j gives alpha_j = (s_j + m alpha_{j-1}) / (w_j + m), m =
        PRIOR_POSITIONS: a depth seen a few times (a short probe at B = 1) leans on the one above
        it, a well-seen one speaks for itself, an unseen one repeats the one above (the conditional
        acceptance of a trained head is about flat in depth: README, served chains).

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
        return out


@dataclass
class StepCosts:
    """Seconds of engine decode steps by K (0 = plain), and of one chained draft step; latest measurements.

    step(K) = K c_draft + c_verify(K): c_draft from drafting timed inside the steps, c_verify(K) =
    step - K c_draft at the measured depths, linear in K between and past them (least squares,
    slope >= 0; constant when one depth was measured). A step at R rows costs scale(R) = 1 + gamma R
    times ``seconds`` (the batch's tail runs few rows): gamma fitted on calls whose steps ran at
    several row counts, 0 until then.

    Example: steps of 9 ms at K=1 and 16 ms at K=4 with c_draft = 2 ms give c_verify = 6.67 + K/3 ms,
    so step(2) = 4 + 7.33 = 11.33 ms.
    """

    seconds: dict[int, float] = field(default_factory=dict)  # K -> median seconds per decode step / scale(rows)
    draft_s: float | None = None  # c_draft, seconds of one chained draft step / scale(rows) (None: never timed)
    measured: dict = field(default_factory=dict, repr=False)  # K or "draft" -> (median rows, median seconds)

    row_slope: float | None = None  # gamma: a step at R rows costs (1 + gamma R) units (None: never fitted)
    prefill_slope: float | None = None  # c_verify per extra depth from the prefill, / scale (``fit_prefill``)

    def scale(self, rows):
        """1 + gamma rows: the cost of a step at ``rows`` rows in the units of ``seconds``."""
        return 1.0 + (self.row_slope or 0.0) * rows

    def fit_rows(self, step_times: list[tuple[int, float, float]]) -> None:
        """Updates gamma from steps at several row counts (least squares a + b R, gamma = b / a in [0, 1])."""
        rows = [float(r) for r, _, _ in step_times]
        if max(rows, default=0) - min(rows, default=0) < 2:
            return
        mean_r, mean_s = statistics.fmean(rows), statistics.fmean(s for _, s, _ in step_times)
        b = sum((r - mean_r) * (s - mean_s) for r, (_, s, _) in zip(rows, step_times)) \
            / sum((r - mean_r) ** 2 for r in rows)
        a = mean_s - b * mean_r
        gamma = 0.0 if b <= 0 else (1.0 if a <= b else b / a)
        self.row_slope = gamma if self.row_slope is None else (self.row_slope + gamma) / 2

    def excess(self, k: int, step_time: tuple[int, float, float]) -> float:
        """Seconds a call's first step (at depth k) took beyond a step's predicted cost, at least 0."""
        base = self.step_seconds(k)
        return max(0.0, step_time[1] - base * self.scale(step_time[0])) if base else 0.0

    def observe(self, k: int, step_times: list[tuple[int, float, float]]) -> None:
        """Learns from a call's ``GenerationResult.step_times`` at depth k (0 = plain)."""
        if not step_times:
            return
        self.fit_rows(step_times)
        self.measured[k] = (statistics.median(r for r, _, _ in step_times), statistics.median(s for _, s, _ in step_times))
        drafted = [(r, d) for r, _, d in step_times if d > 0]
        if k >= 1 and drafted:
            self.measured["draft"] = (statistics.median(r for r, _ in drafted), statistics.median(d for _, d in drafted) / k)
        for key, (rows, seconds) in self.measured.items():  # NOTE: all re-read at the newest gamma
            if key == "draft":
                self.draft_s = seconds / self.scale(rows)
            else:
                self.seconds[key] = seconds / self.scale(rows)

    def verify_seconds(self, k: int) -> float | None:
        """c_verify(K), or None without a timed draft step and a measured depth.

        A line through the measured depths (least squares, slope >= 0); with one drafted depth, the
        plain step is the line's K = 0 point (a verify pass over one token per row: on the same line
        within ~0.4 ms here, bench/auto.py), else the slope comes from ``prefill_slope``, else 0.
        """
        points = sorted((j, s - j * self.draft_s) for j, s in self.seconds.items() if j >= 1) \
            if self.draft_s is not None else []
        if not points:
            return None
        if len(points) == 1 and 0 in self.seconds:
            points.insert(0, (0, self.seconds[0]))
        if len(points) == 1:
            (j, v), = points
            return v + (self.prefill_slope or 0.0) * (k - j)
        mean_k = sum(j for j, _ in points) / len(points)
        mean_v = sum(v for _, v in points) / len(points)
        slope = sum((j - mean_k) * (v - mean_v) for j, v in points) / sum((j - mean_k) ** 2 for j, _ in points)
        return mean_v + max(0.0, slope) * (k - mean_k)

    def fit_prefill(self, k: int, rows: int, prompt_len: float, prefill_s: float) -> None:
        """``prefill_slope`` from a prefill of ``prompt_len`` tokens per row beside verify steps at depth k.

        The prefill is a forward over prompt_len tokens per row, a verify pass one over k + 1: the
        difference over the extra tokens estimates the verify cost of one more draft depth (it also
        holds the head's prefill, so it errs high: toward shallower K). Unchanged when it cannot say.
        """
        verify = self.verify_seconds(k) if k in self.seconds else None
        if verify is None or prompt_len <= k + 1:
            return
        self.prefill_slope = max(0.0, (prefill_s / self.scale(rows) - verify) / (prompt_len - (k + 1)))

    def step_seconds(self, k: int) -> float | None:
        """Predicted seconds of a step at depth k (0 = plain), or None when nothing predicts it.

        A plain step never timed is bounded below by the cheapest c_verify(K) measured: it is a
        verify step's work over 1 token instead of K+1, with no verification.
        """
        if k in self.seconds:
            return self.seconds[k]
        if k == 0:
            bounds = [self.verify_seconds(j) for j in self.seconds if j >= 1]
            return min(bounds) if bounds and bounds[0] is not None else None
        verify = self.verify_seconds(k)
        return None if verify is None else verify + k * self.draft_s


def predict(mode: str, k: int, acceptance: Acceptance, costs: StepCosts, rows: float) -> float:
    """Predicted tokens/s of (mode, K) for ``rows`` decoding rows; 0 when the costs cannot say.

    Example: rs, K=2, alpha_RS = [0.5, 0.5], 0.01 s per step, 4 rows -> 4 * 1.75 / 0.01 = 700.
    """
    seconds = costs.step_seconds(0 if mode == "none" else k)
    if not seconds:
        return 0.0
    tokens = 1.0 if mode == "none" else 1.0 + expected_accepted(acceptance.alphas(mode, k))
    return rows * tokens / (seconds * costs.scale(rows))


@dataclass
class Decision:
    """The chosen setting, its prediction and every candidate's."""

    mode: str
    speculate_k: int  # 0 for none
    predicted_tok_s: float
    predictions: dict[str, float]  # "none", "to3", "rs1", ... -> predicted tokens/s (calibrated)
    rows: float = 1.0  # decoding rows the predictions are for (tokens/s scales with them)
    measured_tok_s: float = float("nan")  # tokens/s of the steps decoded at the chosen setting
    raw_tok_s: float = float("nan")  # the chosen prediction before calibration
    probed: bool = True  # the call probed settings before deciding (else: decided from earlier calls)

    def to_metrics(self) -> dict:
        return {"auto/mode": self.mode, "auto/speculate_k": self.speculate_k,
                "auto/predicted_tok_s": self.predicted_tok_s, "auto/probed": self.probed}


def config_name(mode: str, k: int) -> str:
    return mode if mode == "none" else f"{mode}{k}"


def family(mode: str) -> str:
    """Calibration family: plain steps, or drafted ones (to and rs share step costs)."""
    return "none" if mode == "none" else "spec"


class AutoChooser:
    """The run's acceptance, cost and length models and calibration; ``choose`` picks the best candidate.

    Calibration: after each decision followed by at least MIN_CALIBRATION_STEPS steps, log(measured /
    predicted tokens/s of the steps decoded at the choice) updates a running log-ratio of the chosen family (``family``; starts at 0, weight CALIBRATION
    on the newest); predictions are multiplied by exp of their family's ratio, or of the mean of the known
    ones for a family never chosen (no change of rank between unmeasured families).
    """

    def __init__(self) -> None:
        self.acceptance = Acceptance()
        self.costs = StepCosts()
        self.lengths = Lengths()
        self.prefill_s: float = 0.0  # seconds of the latest call's prefill
        self.log_ratio: dict[str, float] = {}  # family -> running log(measured / predicted)

    def observe(self, result: GenerationResult, mode: str, k: int, greedy: bool) -> None:
        """Learns from a call decoded at (mode, K): step times, lengths, prefill and, when it drafted, alphas.

        The call's first step is priced as part of the prefill (``StepCosts.excess``), not as a step.
        """
        depth, times = 0 if mode == "none" else k, result.step_times
        self.costs.observe(depth, times[1:] or times)
        self.lengths.add(result.lengths)
        self.prefill_s = result.prefill_seconds + (self.costs.excess(depth, times[0]) if times else 0.0)
        if mode != "none":
            self.acceptance.observe(result.stats, greedy)

    def factor(self, mode: str) -> float:
        known = self.log_ratio.get(family(mode))
        if known is None and self.log_ratio:
            known = statistics.fmean(self.log_ratio.values())
        return math.exp(known or 0.0)

    def calibrate(self, decision: Decision) -> None:
        """Updates the chosen family's ratio from the decision's measured tokens/s."""
        if not (decision.measured_tok_s > 0 and decision.raw_tok_s > 0):
            return
        new = math.log(decision.measured_tok_s / decision.raw_tok_s)
        old = self.log_ratio.get(family(decision.mode), 0.0)  # NOTE: starts at 0 (shrinks one noisy call's ratio)
        self.log_ratio[family(decision.mode)] = (1 - CALIBRATION) * old + CALIBRATION * new

    def rate(self, mode: str, k: int, remaining: np.ndarray, prefill_s: float = 0.0) -> float:
        """Uncalibrated tokens/s of (mode, K) over ``remaining`` (S, R) tokens per row, the tail priced
        (``bebop.spec.tail.call_rate``); 0 when the costs cannot say."""
        base = self.costs.step_seconds(0 if mode == "none" else k)
        if not base:
            return 0.0
        alphas = [] if mode == "none" else self.acceptance.alphas(mode, k)
        return call_rate(remaining, alphas, lambda rows: base * self.costs.scale(rows), prefill_s)

    def predict_call(self, mode: str, k: int, batch: int, max_new: int) -> float:
        """Calibrated tokens/s of a whole call of ``batch`` fresh rows at (mode, K), prefill included."""
        remaining = self.lengths.remaining([0] * batch, max_new, np.random.default_rng(TAIL_SEED))
        return self.rate(mode, k, remaining, self.prefill_s) * self.factor(mode)

    def none_could_win(self, options: list[tuple[str, int]], rows: float) -> bool:
        """Whether ``none``, at its bound (``StepCosts.step_seconds(0)``) when never timed, beats every
        drafted candidate; True when nothing bounds it."""
        drafted = [predict(m, k, self.acceptance, self.costs, rows) for m, k in options if m != "none"]
        if self.costs.step_seconds(0) is None or not drafted:
            return True
        return predict("none", 0, self.acceptance, self.costs, rows) >= max(drafted)

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

    def choose(self, options: list[tuple[str, int]], rows: float, generated: list[int] | None = None,
               max_new: int = 0) -> Decision:
        """The candidate with the highest predicted tokens/s (the first of equals).

        With ``generated`` (tokens each active row has emitted) and ``max_new``, the rest of the call
        is priced with its tail (``rate``) and calibrated; without, rows (1 + E[L]) / step cost.
        """
        if generated is None:
            raw = {config_name(m, k): predict(m, k, self.acceptance, self.costs, rows) for m, k in options}
            predictions = dict(raw)
        else:
            remaining = self.lengths.remaining(generated, max_new, np.random.default_rng(TAIL_SEED))
            raw = {config_name(m, k): self.rate(m, k, remaining) for m, k in options}
            predictions = {config_name(m, k): raw[config_name(m, k)] * self.factor(m) for m, k in options}
        mode, k = max(options, key=lambda c: predictions[config_name(*c)])
        name = config_name(mode, k)
        return Decision(mode, k, predictions[name], predictions, rows, raw_tok_s=raw[name])


def probe_rule(options: list[tuple[str, int]]) -> str | None:
    """The rule of drafted probe steps: ``rs`` when allowed (its steps record both alphas), else ``to``."""
    modes = {m for m, _ in options if m != "none"}
    return "rs" if "rs" in modes else ("to" if modes else None)


def _probe(decoder: Decoder, chooser: AutoChooser, options, setting, greedy: bool, prompt_len: float):
    """The probe's steps; returns (depth, step time) of the call's first step (None: no step).

    1. PROBE_STEPS at the deepest K (``probe_rule``), more until PROBE_POSITIONS rows were drafted
       for: both alphas at every depth, c_draft, c_verify(K).
    2. PROBE_STEPS plain, when plain decoding could win at its bound (``none_could_win``); they also
       give the verify line its K = 0 point.
    3. Otherwise PROBE_STEPS at the shallower K predicted best, when it could win (``shallow_could_win``,
       the verify slope estimated from the prefill): a second depth for the verify line.
    Each block's first step is not timed (it also feeds the head what the previous setting left
    pending: up to K+1 positions after a verify step, the prompt after the prefill) unless
    PROBE_STEPS is 1. A setting that cannot win is never probed, so a call whose best setting is the
    deepest pays no probe at all (B = 1 at high acceptance: the whole call is a few steps).
    """
    first_step = None

    def run(mode: str, k: int, positions: int = 0) -> None:
        nonlocal first_step
        decoder.set_spec(setting(mode, k))
        steps = []
        while decoder.num_active and (len(steps) < PROBE_STEPS or sum(r for r, _, _ in steps) < positions):
            steps.append(decoder.step())
        first_step = first_step or (k, steps[0]) if steps else first_step
        chooser.costs.observe(k, steps if PROBE_STEPS < 2 else steps[1:])

    rule = probe_rule(options)
    depths = sorted(k for m, k in options if m != "none")
    if rule is not None and decoder.num_active:
        run(rule, depths[-1], PROBE_POSITIONS)
        chooser.acceptance.observe(decoder.stats_so_far(), greedy)  # NOTE: only the deep probe's positions
        chooser.costs.fit_prefill(depths[-1], len(decoder.prompt_ids), prompt_len, decoder.prefill_seconds)
    rows = max(decoder.num_active, 1)
    if ("none", 0) in options and len(options) > 1 and decoder.num_active and chooser.none_could_win(options, rows):
        run("none", 0)
    elif rule is not None and decoder.num_active:
        shallow = chooser.shallow_could_win(options, rows)
        if shallow is not None:
            run(rule, shallow)
    return first_step


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
) -> tuple[GenerationResult, Decision]:
    """``generate`` with the mode and/or K chosen within the call: probe steps, a decision, the rest.

    Args:
        model, tokenizer, prompts, mtp, sampling, seed, step, row_ids: as for ``generate``.
        spec: mode and/or speculate_k ``"auto"``; the other fields as for ``generate``.
        chooser: the run's models (RL keeps one across steps); a fresh one when None.
        probe: probe settings first (``_probe``); False decides before the first step from what the
            chooser learned in earlier calls (RL between probes), or probes when it knows no costs.

    Returns:
        ``(result, decision)``: the completions (every probe token kept) with the statistics of the
        whole call, and the decision with its prediction and the tokens/s measured after it.
    """
    check_auto_spec(spec)
    options = candidates(spec)
    max_k = max(k for _, k in options)
    if mtp is None and max_k:
        raise BebopError(f"mode {spec.mode!r} needs an MTP head (--mtp)")
    chooser = chooser if chooser is not None else AutoChooser()
    chooser.acceptance.decay(DECAY)
    prior = copy.deepcopy(chooser.acceptance)  # the evidence of earlier calls
    greedy = sampling.temperature == 0
    setting = (lambda mode, k: dataclasses.replace(spec, mode=mode, speculate_k=max(k, 1)))
    probe = probe or not all(chooser.costs.step_seconds(0 if m == "none" else k) for m, k in options)
    decision = None
    if probe:
        rule = probe_rule(options)
        first = (rule, max_k) if rule is not None else options[0]
    else:
        decision = chooser.choose(options, rows=len(prompts), generated=[0] * len(prompts),
                                  max_new=sampling.max_new_tokens)
        first = (decision.mode, decision.speculate_k)
    decoder = Decoder(model, tokenizer, prompts, mtp=mtp if max_k else None, sampling=sampling, spec=setting(*first),
                      seed=seed, step=step, row_ids=row_ids, max_speculate_k=max_k, time_drafts=True)
    first_step = None
    if probe:
        prompt_len = statistics.fmean(len(p) for p in decoder.prompt_ids)
        first_step = _probe(decoder, chooser, options, setting, greedy, prompt_len)
        active = decoder.active_lengths() if decoder.num_active else None
        decision = chooser.choose(options, rows=max(decoder.num_active, 1), generated=active,
                                  max_new=sampling.max_new_tokens)
    decision.probed = probe
    decoder.set_spec(setting(decision.mode, decision.speculate_k))
    if not probe and decoder.num_active:  # NOTE: the first step also feeds the head the prompt: priced as prefill
        first_step = (decision.speculate_k, decoder.step())
    start, before, rest, rows = time.perf_counter(), decoder.num_tokens(), [], list(decoder.rows.index)
    generated = decoder.active_lengths()
    while decoder.num_active:
        rest.append(decoder.step())
    if rest:
        decision.measured_tok_s = (decoder.num_tokens() - before) / max(time.perf_counter() - start, 1e-9)
    if len(rest) >= MIN_CALIBRATION_STEPS:
        # NOTE: calibrated against the tokens the rows really had left, so it corrects the cost and
        # acceptance models, not the length model (which knows nothing in a run's first call)
        left = np.array([len(decoder.runner.outputs[i]) - n for i, n in zip(rows, generated)])
        decision.raw_tok_s = chooser.rate(decision.mode, decision.speculate_k, np.tile(left, (SCENARIOS, 1)))
        chooser.calibrate(decision)
    chooser.costs.observe(decision.speculate_k, rest)
    result = decoder.result()
    chooser.acceptance = prior  # every drafted position of the call, once
    chooser.acceptance.observe(result.stats, greedy)
    chooser.lengths.add(result.lengths)
    chooser.prefill_s = result.prefill_seconds + (chooser.costs.excess(*first_step) if first_step else 0.0)
    return result, decision
