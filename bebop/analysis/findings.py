"""The paper's findings, each with our number and a verdict computed from measured data.

``compute_findings(head_evals, sweep, runs)`` turns what ``bebop demo`` measures (MTP-head
evaluations per draft loss, a temperature sweep, RL runs) into one ``Finding`` per claim of
arXiv 2606.12370; ``findings_table`` renders them as a markdown table for the report. No
verdict is typed in by hand: each is a rule on the numbers, stated below and in the
constants, and every number in the table comes from the inputs.

Terms (p is the target distribution, q the draft's): alpha_RS = sum_v min(p, q),
alpha_TO = p(argmax q), accept length = 1 + accepted drafts per verify pass, H = H(p) in nats.

Verdicts are ``REPRODUCED``, ``NOT_REPRODUCED`` or ``NOT_COMPARABLE`` (an input is missing or
too narrow to test the claim); there is no "partly". Rules:

1. TO accept length falls linearly with entropy: slope CI below 0 and r < ``MAX_R``.
2. RS with an e2e-TV head is flatter than with a CE head: the CE slope's CI lies below 0 and
   |s_TV| <= ``FLATTER_RATIO`` * |s_CE| (the paper's ">95% flatter").
3. Mean alpha_RS by loss: e2e_tv > tv > rkl > fkl ~ ce, where gaps up to ``TIE_POINTS`` are ties
   ("~") and ">" needs a larger gap.
4. The e2e-TV gain over CE in alpha_RS,j grows strictly with j and is > 0 at the last step.
5. Mean alpha_TO differs by at most ``TO_SPREAD_POINTS`` across losses.
6. The frozen rs+e2e_tv run ends with an accept length >= the online-CE run's, and the online-CE
   run declines from start to end (first/last ``report.WINDOW_FRAC`` of the steps).
7. RL step speed-up of rs+e2e_tv (frozen) over ``none`` is >= the paper's lower end, 1.5x.

Entropy slopes (findings 1 and 2) come from up to three sources, all reported, the first
comparable one deciding: (a) one point per RL step (Fig. 8), (b) the temperature sweep
(Fig. 12a), (c) token level. A source is comparable with >= ``MIN_POINTS`` points spread over
>= ``MIN_ENTROPY_RANGE`` nats. How we deviate from the paper:

1. The token-level source fits alpha against H at each draft depth j and converts to accept
   length units by the chain rule at the mean alpha per depth: dL/dH = sum_i w_i s_i with
   w_i = d(1 + sum_j prod_{k<=j} alpha_k)/d alpha_i, i.e. as if H moved by the same amount at
   every depth. Its interval adds the per-depth variances (depths treated as independent)
   and its r is that of the pooled token-level fit.
2. RL-step points of several runs with the same role are pooled into one fit. Token-level
   points pool every frozen head of that loss, whatever the rollout mode: alpha_RS and alpha_TO
   are recorded for the head at each verified position, accepted or not.
3. Findings 6 and 7 use the first run of each role.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np

from bebop.analysis.fit import bucketed_fit, linear_fit, student_t_quantile
from bebop.analysis.report import MISSING, Run, _as_float, _column, _table, summarize_run

REPRODUCED = "reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_COMPARABLE = "not comparable"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, NOT_COMPARABLE)

MIN_ENTROPY_RANGE = 0.05  # nats; a narrower spread of entropies is too little to fit a slope on
MIN_POINTS = 3  # a slope interval needs at least one residual degree of freedom
CONFIDENCE = 0.95  # coverage of every slope interval
MAX_R = -0.5  # finding 1: the correlation must be at least this strongly negative
FLATTER_RATIO = 0.05  # finding 2: |s_TV| <= 5% of |s_CE| is the paper's ">95% flatter"
TIE_POINTS = 0.5  # finding 3: gaps up to this many points of alpha_RS count as "≈"
TO_SPREAD_POINTS = 0.3  # finding 5: the paper's bound on the alpha_TO spread across losses (Fig. 5)
PAPER_SPEEDUP = (1.5, 1.8)  # finding 7: per-step RL speed-up of MTP + RS over no MTP (Fig. 7)
CE_LOSS = "ce"  # the baseline draft loss
TV_LOSS = "e2e_tv"  # the paper's recommended draft loss
TABLE2_ORDER = ("e2e_tv", "tv", "rkl", "fkl", "ce")  # finding 3, best first; the last two tie
TOKEN_SOURCE = "token level"  # name of slope source (c) in the table
LOSS_NAMES = {"ce": "CE", "fkl": "FKL", "rkl": "RKL", "tv": "TV", "e2e_tv": "e2e TV"}


class HeadEval(TypedDict):
    """``bebop eval-mtp --json`` of one head at K = 3, T = 1 (values of ``head_evals``)."""

    alpha_rs: list[float]  # (K,) mean sum_v min(p, q) at draft step j
    alpha_to: list[float]  # (K,) mean p(argmax q) at draft step j
    accept_length_rs: float  # 1 + E[L] under rejection sampling
    accept_length_to: float  # 1 + E[L] under target-only verification
    target_entropy: float  # mean H(p) over chain steps, nats
    num_positions: int  # chains evaluated


class SweepRow(TypedDict):
    """One head evaluated at one temperature (applied to both p and q)."""

    loss: str  # draft loss the head was trained with
    temperature: float  # tau
    target_entropy: float  # mean H(softmax(z / tau)) of the target, nats
    accept_length_rs: float  # 1 + E[L] under rejection sampling
    accept_length_to: float  # 1 + E[L] under target-only verification
    alpha_rs: list[float]  # (K,) per draft step
    alpha_to: list[float]  # (K,) per draft step


@dataclasses.dataclass(frozen=True)
class Finding:
    """One claim of the paper next to our measurement."""

    number: int  # row number in the report, 1-based
    claim: str  # the finding in a few words
    paper: str  # the paper's number
    ours: str  # our number(s), from the inputs
    verdict: str  # one of VERDICTS
    note: str  # computed facts behind a negative or missing verdict, or the deciding source


@dataclasses.dataclass(frozen=True)
class SlopeEstimate:
    """An accept-length-vs-entropy slope from one source, or why that source cannot give one."""

    source: str  # "RL steps", "temperature sweep" or "token level"
    slope: float  # accept length per nat
    ci: tuple[float, float]  # CONFIDENCE interval of the slope
    r: float  # Pearson correlation of acceptance and entropy
    entropy_span: tuple[float, float]  # (min, max) entropy of the points, nats
    n: int  # points fitted
    reason: str = ""  # why the source is not comparable; "" when it is

    @property
    def comparable(self) -> bool:
        return not self.reason

    def describe(self) -> str:
        if not self.comparable:
            return f"{self.source}: not comparable ({self.reason})"
        lo, hi = self.ci
        h0, h1 = self.entropy_span
        how = " (per-depth α slopes → accept length by the chain rule)" if self.source == TOKEN_SOURCE else ""
        return (f"{self.source}: {self.slope:+.2f} [{lo:+.2f}, {hi:+.2f}] /nat, r = {self.r:+.2f}, "
                f"H {h0:.2f}–{h1:.2f} nats, n = {self.n}{how}")


def _unavailable(source: str, reason: str) -> SlopeEstimate:
    return SlopeEstimate(source, math.nan, (math.nan, math.nan), math.nan, (math.nan, math.nan), 0, reason)


def _check_spread(entropy: np.ndarray) -> str:
    """Why ``entropy`` (the finite points) cannot support a slope, or ""."""
    if entropy.size < MIN_POINTS:
        return f"{entropy.size} point(s), need {MIN_POINTS}"
    span = float(entropy.max() - entropy.min())
    if span < MIN_ENTROPY_RANGE:
        return f"entropy range was {span:.3f} nats, below {MIN_ENTROPY_RANGE}"
    return ""


def _estimate(source: str, entropy: np.ndarray, accept: np.ndarray) -> SlopeEstimate:
    """Fits accept ~ entropy over the finite pairs, checking the number and spread of points."""
    keep = np.isfinite(entropy) & np.isfinite(accept)
    h, a = entropy[keep], accept[keep]
    reason = _check_spread(h)
    if reason:
        return _unavailable(source, reason)
    fit = linear_fit(h, a, CONFIDENCE)
    return SlopeEstimate(source, fit.slope, fit.slope_ci, fit.r, (float(h.min()), float(h.max())), fit.n)


# --------------------------------------------------------------------------------------------
# Slope sources
# --------------------------------------------------------------------------------------------


def _steps_estimate(runs: Sequence[Run], role: str) -> SlopeEstimate:
    """(a) Accept length against target entropy, one point per RL step, the runs pooled."""
    source = "RL steps"
    if not runs:
        return _unavailable(source, f"no {role} run")
    entropy = np.concatenate([_column(r.metrics, "target_entropy") for r in runs])  # (S,)
    accept = np.concatenate([_column(r.metrics, "spec/accept_length") for r in runs])  # (S,)
    return _estimate(source, entropy, accept)


def _sweep_estimate(sweep: Sequence[Mapping], loss: str, method: str) -> SlopeEstimate:
    """(b) accept_length_{method} against target entropy across the temperatures of one head."""
    source = "temperature sweep"
    rows = [r for r in sweep if r.get("loss") == loss]
    if not rows:
        return _unavailable(source, f"no sweep of the {loss} head")
    entropy = np.array([_as_float(r.get("target_entropy")) for r in rows])  # (N,)
    accept = np.array([_as_float(r.get(f"accept_length_{method}")) for r in rows])  # (N,)
    return _estimate(source, entropy, accept)


def chain_weights(mean_alpha: Sequence[float]) -> np.ndarray:
    """d(accept length)/d(alpha_i) of 1 + sum_j prod_{k<=j} alpha_k, at the given alphas.

    Example:
        >>> chain_weights([0.5, 0.5]).tolist()  # L = 1 + a1 + a1 a2: (1 + a2, a1)
        [1.5, 0.5]
    """
    a = np.asarray(mean_alpha, dtype=float)  # (K,)
    weights = np.zeros_like(a)
    for j in range(a.size):
        for i in range(j + 1):
            weights[i] += float(np.prod(np.delete(a[: j + 1], i)))
    return weights


def _token_estimate(runs: Sequence[Run], method: str) -> SlopeEstimate:
    """(c) Per-depth token-level fits of alpha_{method} on H, converted to accept length per nat."""
    source = TOKEN_SOURCE
    rows = [row for run in runs for row in (run.token_stats or [])]
    if not rows:
        return _unavailable(source, "no token stats")
    keys = ("position", "entropy", f"alpha_{method}")
    pos, h, a = (np.array([_as_float(v) for row in rows for v in row[k]]) for k in keys)  # (N,) each
    keep = np.isfinite(pos) & np.isfinite(h) & np.isfinite(a)
    pos, h, a = pos[keep], h[keep], a[keep]
    depths = sorted({int(j) for j in pos})
    if depths != list(range(1, len(depths) + 1)):
        return _unavailable(source, f"draft depths {depths} are not 1..K")
    reason = _check_spread(h)
    if reason:
        return _unavailable(source, reason)
    fits = [bucketed_fit(h[pos == j], a[pos == j], confidence=CONFIDENCE).fit for j in depths]
    if any(not math.isfinite(f.slope_stderr) for f in fits):
        return _unavailable(source, "a draft depth has too few points or no entropy spread")
    weights = chain_weights([float(a[pos == j].mean()) for j in depths])  # (K,)
    slope = float(sum(w * f.slope for w, f in zip(weights, fits)))
    stderr = math.sqrt(sum((w * f.slope_stderr) ** 2 for w, f in zip(weights, fits)))
    t = student_t_quantile(0.5 * (1.0 + CONFIDENCE), min(f.n for f in fits) - 2)
    pooled = linear_fit(h, a, CONFIDENCE)
    return SlopeEstimate(source, slope, (slope - t * stderr, slope + t * stderr), pooled.r,
                         (float(h.min()), float(h.max())), int(h.size))


# --------------------------------------------------------------------------------------------
# Runs by role
# --------------------------------------------------------------------------------------------


def _runs_with(runs: Sequence[Run], mode: str | None, loss: str, update: str = "frozen",
               online_loss: str | None = None) -> list[Run]:
    """Runs whose config matches: mode (None = any speculative mode), head loss, update, online loss."""
    def matches(run: Run) -> bool:
        cfg = run.config
        run_mode = str(cfg.get("mode") or "none")
        return (run_mode != "none" and (mode is None or run_mode == mode) and cfg.get("mtp_loss") == loss
                and (cfg.get("mtp_update") or "frozen") == update
                and (online_loss is None or cfg.get("online_loss") == online_loss))
    return [r for r in runs if matches(r)]


def _none_runs(runs: Sequence[Run]) -> list[Run]:
    return [r for r in runs if str(r.config.get("mode") or "none") == "none"]


# --------------------------------------------------------------------------------------------
# Findings
# --------------------------------------------------------------------------------------------


def _to_slope_finding(sweep: Sequence[Mapping], runs: Sequence[Run]) -> Finding:
    """Finding 1: TO accept length falls linearly with entropy."""
    to_runs = _runs_with(runs, "to", CE_LOSS)
    estimates = [_steps_estimate(to_runs, "to+ce"), _sweep_estimate(sweep, CE_LOSS, "to"),
                 _token_estimate(_runs_with(runs, None, CE_LOSS), "to")]
    index = next((i for i, e in enumerate(estimates) if e.comparable), None)
    chosen = None if index is None else estimates[index]
    ours = "; ".join(e.describe() + (" ← decides" if e is chosen else "") for e in estimates)
    args = (1, "TO accept length falls linearly with entropy", "slope −1.68 /nat, r strongly negative (Fig. 8)", ours)
    if chosen is None:
        reasons = "; ".join(f"{e.source}: {e.reason}" for e in estimates)
        return Finding(*args, NOT_COMPARABLE, f"no source gives a slope: {reasons}")
    problems = []
    if not chosen.ci[1] < 0:
        problems.append(f"slope CI [{chosen.ci[0]:+.2f}, {chosen.ci[1]:+.2f}] does not lie below 0")
    if not chosen.r < MAX_R:
        problems.append(f"r = {chosen.r:+.2f} is not below {MAX_R}")
    skipped = [f"{e.source}: {e.reason}" for e in estimates[:index]]
    note = "; ".join([f"decided by {chosen.source}", *problems, *skipped])
    return Finding(*args, NOT_REPRODUCED if problems else REPRODUCED, note)


def _flattening(ce: SlopeEstimate, tv: SlopeEstimate) -> float:
    """Percent by which the TV slope is flatter than the CE slope."""
    return 100.0 * (1.0 - abs(tv.slope) / abs(ce.slope)) if ce.slope != 0 else math.nan


def _rs_flatness_finding(sweep: Sequence[Mapping], runs: Sequence[Run]) -> Finding:
    """Finding 2: RS with an e2e-TV head is >95% flatter in entropy than with a CE head."""
    ce_runs, tv_runs = _runs_with(runs, "rs", CE_LOSS), _runs_with(runs, "rs", TV_LOSS)
    pairs = [
        (_steps_estimate(ce_runs, "rs+ce"), _steps_estimate(tv_runs, "rs+e2e_tv")),
        (_sweep_estimate(sweep, CE_LOSS, "rs"), _sweep_estimate(sweep, TV_LOSS, "rs")),
        (_token_estimate(_runs_with(runs, None, CE_LOSS), "rs"),
         _token_estimate(_runs_with(runs, None, TV_LOSS), "rs")),
    ]
    index = next((i for i, (ce, tv) in enumerate(pairs) if ce.comparable and tv.comparable), None)
    chosen = None if index is None else pairs[index]

    def reasons(ce: SlopeEstimate, tv: SlopeEstimate) -> str:
        return "; ".join(f"{name} head: {e.reason}" for name, e in (("CE", ce), ("TV", tv)) if e.reason)

    def describe(ce: SlopeEstimate, tv: SlopeEstimate) -> str:
        if not (ce.comparable and tv.comparable):
            return f"{ce.source}: not comparable ({reasons(ce, tv)})"
        mark = " ← decides" if chosen is not None and ce is chosen[0] else ""
        return f"{ce.source}: TV {tv.slope:+.2f} vs CE {ce.slope:+.2f} /nat, {_flattening(ce, tv):.0f}% flatter{mark}"

    ours = "; ".join(describe(*p) for p in pairs)
    args = (2, "RS with a TV head is much flatter in entropy than with CE",
            "RS-TV −0.06 vs RS-CE −1.68 /nat: >95% flatter (Fig. 8)", ours)
    if chosen is None:
        return Finding(*args, NOT_COMPARABLE, "no source gives both slopes: " + "; ".join(
            f"{p[0].source}: {reasons(*p)}" for p in pairs))
    ce, tv = chosen
    skipped = [f"{p[0].source}: {reasons(*p)}" for p in pairs[:index]]
    problems = []
    if not ce.ci[1] < 0:
        problems.append(f"CE slope CI [{ce.ci[0]:+.2f}, {ce.ci[1]:+.2f}] does not lie below 0: nothing to flatten")
    if not abs(tv.slope) <= FLATTER_RATIO * abs(ce.slope):
        problems.append(f"|TV slope| is {abs(tv.slope) / abs(ce.slope):.0%} of |CE slope| "
                        f"(needs ≤ {FLATTER_RATIO:.0%})" if ce.slope != 0 else "CE slope is 0")
    note = "; ".join([f"decided by {ce.source}", *problems, *skipped])
    return Finding(*args, NOT_REPRODUCED if problems else REPRODUCED, note)


def _mean_points(evals: Mapping[str, Mapping], key: str) -> dict[str, float]:
    """100 x the mean over draft steps of evals[loss][key], for the losses that have it."""
    out = {}
    for loss, e in evals.items():
        values = [_as_float(v) for v in (e.get(key) or [])]
        if values and all(math.isfinite(v) for v in values):
            out[loss] = 100.0 * float(np.mean(values))
    return out


def _order_text(means: Mapping[str, float]) -> str:
    """Losses from best to worst, joined by ">" or, for gaps up to TIE_POINTS, "≈"."""
    ranked = sorted(means, key=lambda k: -means[k])
    text = ranked[0]
    for prev, cur in zip(ranked, ranked[1:]):
        text += f" {'≈' if means[prev] - means[cur] <= TIE_POINTS else '>'} {cur}"
    return text


def _rs_order_finding(head_evals: Mapping[str, Mapping]) -> Finding:
    """Finding 3: RS acceptance by loss is e2e_tv > tv > rkl > fkl ≈ ce."""
    means = _mean_points(head_evals, "alpha_rs")
    args = (3, "RS acceptance by loss: e2e_tv > tv > rkl > fkl ≈ ce",
            "CE 75.0, KL +0.0, RKL +1.3, TV +2.4, e2e TV +3.0 (Table 2, Math)")
    missing = [k for k in TABLE2_ORDER if k not in means]
    if missing:
        return Finding(*args, MISSING, NOT_COMPARABLE, f"no alpha_RS for {', '.join(missing)}")
    base = means[CE_LOSS]
    values = ", ".join(f"{LOSS_NAMES[k]} {means[k] - base:+.1f}" for k in reversed(TABLE2_ORDER[:-1]))
    ours = f"CE {base:.1f}, {values}; order {_order_text(means)}"
    e2e, tv, rkl, fkl, ce = (means[k] for k in TABLE2_ORDER)
    checks = [("e2e_tv − tv", e2e - tv, True), ("tv − rkl", tv - rkl, True),
              ("rkl − max(fkl, ce)", rkl - max(fkl, ce), True), ("|fkl − ce|", abs(fkl - ce), False)]
    problems = [f"{name} = {gap:+.2f} points (needs {'>' if strict else '≤'} {TIE_POINTS})"
                for name, gap, strict in checks if (gap <= TIE_POINTS) == strict]
    return Finding(*args, ours, NOT_REPRODUCED if problems else REPRODUCED, "; ".join(problems))


def _depth_gain_finding(head_evals: Mapping[str, Mapping]) -> Finding:
    """Finding 4: alpha_RS,j(e2e_tv) − alpha_RS,j(ce) grows with the draft step j."""
    args = (4, "The e2e-TV gain over CE grows with draft depth",
            "≈ +5 points at step 3, +2.5–5 at step 2 (Fig. 4)")
    ce = [_as_float(v) for v in (head_evals.get(CE_LOSS) or {}).get("alpha_rs") or []]
    tv = [_as_float(v) for v in (head_evals.get(TV_LOSS) or {}).get("alpha_rs") or []]
    if len(ce) < 2 or len(ce) != len(tv) or not all(math.isfinite(v) for v in ce + tv):
        return Finding(*args, MISSING, NOT_COMPARABLE,
                       f"need alpha_RS of {CE_LOSS} and {TV_LOSS} at the same >= 2 draft steps")
    gains = [100.0 * (t - c) for t, c in zip(tv, ce)]
    ours = " / ".join(f"{g:+.1f}" for g in gains) + f" points at steps 1–{len(gains)}"
    problems = [f"gain does not grow from step {j} ({gains[j - 1]:+.2f}) to step {j + 1} ({gains[j]:+.2f})"
                for j in range(1, len(gains)) if not gains[j] > gains[j - 1]]
    if not gains[-1] > 0:
        problems.append(f"step-{len(gains)} gain is {gains[-1]:+.2f} points, not > 0")
    return Finding(*args, ours, NOT_REPRODUCED if problems else REPRODUCED, "; ".join(problems))


def _to_spread_finding(head_evals: Mapping[str, Mapping]) -> Finding:
    """Finding 5: under TO every loss gives the same acceptance, within 0.3 points."""
    means = _mean_points(head_evals, "alpha_to")
    args = (5, "Under TO all draft losses are within 0.3%", "< 0.3 points across losses (Fig. 5)")
    if len(means) < 2:
        return Finding(*args, MISSING, NOT_COMPARABLE, "alpha_TO of fewer than two losses")
    hi, lo = max(means, key=means.get), min(means, key=means.get)
    spread = means[hi] - means[lo]
    ours = f"spread {spread:.2f} points over {len(means)} losses ({hi} {means[hi]:.1f}, {lo} {means[lo]:.1f})"
    ok = spread <= TO_SPREAD_POINTS
    note = "" if ok else f"spread {spread:.2f} points > {TO_SPREAD_POINTS}"
    return Finding(*args, ours, REPRODUCED if ok else NOT_REPRODUCED, note)


def _frozen_online_finding(runs: Sequence[Run]) -> Finding:
    """Finding 6: a frozen TV head holds acceptance; online CE updates drag it down."""
    frozen = _runs_with(runs, "rs", TV_LOSS)
    online = _runs_with(runs, "rs", TV_LOSS, update="online", online_loss=CE_LOSS)
    args = (6, "A frozen TV head holds acceptance; online CE drags it down",
            "frozen TV tracks the baseline; online CE decays toward RS-CE (Fig. 9a)")
    missing = [name for name, rs in (("rs+e2e_tv (frozen)", frozen), ("rs+e2e_tv with online CE", online)) if not rs]
    if missing:
        return Finding(*args, MISSING, NOT_COMPARABLE, f"no {' or '.join(missing)} run")
    f, o = summarize_run(frozen[0]), summarize_run(online[0])
    values = (f["accept_length_start"], f["accept_length_end"], o["accept_length_start"], o["accept_length_end"])
    if not all(math.isfinite(v) for v in values):
        return Finding(*args, MISSING, NOT_COMPARABLE, "a run logged no spec/accept_length")
    ours = f"accept length frozen {values[0]:.2f} → {values[1]:.2f}, online-CE {values[2]:.2f} → {values[3]:.2f}"
    problems = []
    if not values[1] >= values[3]:
        problems.append(f"frozen ends {values[3] - values[1]:.3f} below online-CE")
    if not values[3] < values[2]:
        problems.append(f"online-CE run did not decline ({values[3] - values[2]:+.3f})")
    return Finding(*args, ours, NOT_REPRODUCED if problems else REPRODUCED, "; ".join(problems))


def _speedup_finding(runs: Sequence[Run]) -> Finding:
    """Finding 7: the RL step is 1.5–1.8x faster with a frozen e2e-TV head and RS than with no MTP."""
    low, high = PAPER_SPEEDUP
    args = (7, "RL step speed-up of MTP + RS over no MTP", f"{low}–{high}× per step (Fig. 7)")
    base, frozen = _none_runs(runs), _runs_with(runs, "rs", TV_LOSS)
    missing = [name for name, rs in (("none", base), ("rs+e2e_tv (frozen)", frozen)) if not rs]
    if missing:
        return Finding(*args, MISSING, NOT_COMPARABLE, f"no {' or '.join(missing)} run")
    b, f = summarize_run(base[0]), summarize_run(frozen[0])
    if not (b["step_s"] > 0 and f["step_s"] > 0):
        return Finding(*args, MISSING, NOT_COMPARABLE, "a run logged no step_s")
    speedup = b["step_s"] / f["step_s"]
    ours = f"{speedup:.2f}× (none {b['step_s']:.2f} s, rs+e2e_tv {f['step_s']:.2f} s per step)"
    if speedup >= low:
        return Finding(*args, ours, REPRODUCED, "")
    note = f"{speedup:.2f}× < {low}×"
    if 0 < b["rollout_s"] < b["step_s"]:
        bound = b["step_s"] / (b["step_s"] - b["rollout_s"])
        share = b["rollout_s"] / b["step_s"]
        note += f"; rollout is {share:.0%} of the none step, so even free rollouts give at most {bound:.2f}×"
    return Finding(*args, ours, NOT_REPRODUCED, note)


def compute_findings(
    head_evals: Mapping[str, HeadEval], sweep: Sequence[SweepRow], runs: Sequence[Run]
) -> list[Finding]:
    """Computes one Finding per claim of the paper from measured data (see the module docstring).

    Args:
        head_evals: Draft loss name -> ``HeadEval`` (eval-mtp at K = 3, T = 1).
        sweep: ``SweepRow``s: eval-mtp of (at least) the ce and e2e_tv heads at several temperatures.
        runs: RL runs from ``report.load_run``; their configs' mode, mtp_loss, mtp_update and
            online_loss give their roles (none, to+ce, rs+ce, rs+e2e_tv frozen, rs+e2e_tv online CE).

    Returns:
        Findings 1–7, in order. Missing inputs give ``NOT_COMPARABLE`` with the reason.
    """
    return [
        _to_slope_finding(sweep, runs),
        _rs_flatness_finding(sweep, runs),
        _rs_order_finding(head_evals),
        _depth_gain_finding(head_evals),
        _to_spread_finding(head_evals),
        _frozen_online_finding(runs),
        _speedup_finding(runs),
    ]


FINDINGS_HEADER = ("#", "finding", "paper", "ours", "verdict")


def findings_table(findings: Sequence[Finding]) -> str:
    """A markdown table, one row per finding, then one bullet per finding that has a note.

    Example:
        >>> print(findings_table([Finding(1, "c", "p", "o", REPRODUCED, "")]))
        | # | finding | paper | ours | verdict |
        | --- | --- | --- | --- | --- |
        | 1 | c | p | o | reproduced |
    """
    rows = [[str(f.number), f.claim, f.paper, f.ours, f.verdict] for f in findings]
    notes = [f"- **{f.number}** ({f.verdict}): {f.note}" for f in findings if f.note]
    return _table(FINDINGS_HEADER, rows) + ("\n\nNotes:\n\n" + "\n".join(notes) if notes else "")
