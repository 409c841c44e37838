"""The paper's findings, each with our number, an interval where the data give one, and a verdict.

``compute_findings(head_evals, sweep, runs)`` turns what ``bebop demo`` measures (MTP-head
evaluations per draft loss, a temperature sweep, RL runs) into one ``Finding`` per claim of
arXiv 2606.12370; ``findings_table`` renders them as a markdown table. No verdict is typed in by
hand: each is a rule on the numbers, stated below and in the constants.

Terms (p is the target distribution, q the draft's): alpha_RS = sum_v min(p, q),
alpha_TO = p(argmax q), accept length = 1 + accepted drafts per verify pass, H = H(p) in nats.

Verdicts: ``REPRODUCED`` / ``NOT_REPRODUCED`` when our 95% interval lies wholly on the paper's
side of the claim / wholly on the other side; ``INCONCLUSIVE`` when it contains the boundary, so
our sample size cannot tell the claim from its negation (the note says how many more RL steps or
sequences would, see ``bootstrap.decide``); ``NOT_COMPARABLE`` when an input is missing. A finding
with several gaps (3, 4) is not reproduced if one is reversed, reproduced if all hold, else
inconclusive. Rules:

1. TO accept length falls with entropy: slope < 0. The correlation r is reported, not decided on:
   at per-step noise it measures the noise as much as the linearity.
2. RS with an e2e-TV head is >95% flatter than with a CE head: the CE slope < 0 (something to
   flatten; its verdict is the finding's until it is reproduced), then |s_TV| - ``FLATTER_RATIO`` |s_CE| < 0,
   both with intervals.
3. Mean alpha_RS by loss: e2e_tv > tv > rkl > max(fkl, ce). Head evaluations report means only, so
   a gap within +-``TIE_POINTS`` counts as inconclusive (no sample-size estimate). fkl ≈ ce holds by
   construction (soft CE and FKL have the same gradient, q - p): it is shown, not counted.
4. The e2e-TV gain over CE in alpha_RS,j grows with j and is > 0 at the last step (same band).
5. Mean alpha_TO differs by at most ``TO_SPREAD_POINTS`` across losses (the paper's own bound; no
   interval, so reproduced or not). The fkl and ce heads match by construction here too.
6. A frozen head holds acceptance where online CE updates drag it down: the accept-length trend
   per RL step of the frozen rs+e2e_tv runs minus that of the online-CE runs is > 0, with a block
   bootstrap interval over each role's steps.
7. RL step speed-up of rs+e2e_tv (frozen) over ``none`` (ratio of mean step times) is >= the
   paper's lower end, 1.5x, with a block bootstrap interval.
8. Not a claim of the paper, which verifies token by token: e2e-TV's accept-length gain over CE
   survives block verification (Sun et al. 2024, ``bebop.speculative.block``), i.e. the gain
   under block verification is > 0, from the head evaluations' ``accept_length_block``; gains
   within +-``BLOCK_TIE`` are inconclusive. Whether it shrinks or grows against the token-wise
   gain is reported, and other temperatures of the sweep are shown where they have block values.

Entropy slopes (findings 1 and 2) come from up to three sources (``bebop.analysis.slopes``), all
reported, the first comparable one deciding: RL steps (Fig. 8), the temperature sweep (Fig. 12a),
token level. Runs of one role (seeds) are pooled. Each role's data are resampled with a seed
derived from them, so roles' draws are independent and combine into intervals of differences and
ratios.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TypedDict

import numpy as np

from bebop.analysis import bootstrap
from bebop.analysis.bootstrap import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, decide
from bebop.analysis.markdown import MISSING, markdown_table
from bebop.analysis.runs import Run, as_float
from bebop.analysis.roles import CE_LOSS, TV_LOSS, none_runs, runs_with
from bebop.analysis.summary import describe_speedup, rollout_share, step_speedup, summarize_run
from bebop.analysis.slopes import (
    SlopeEstimate,
    chain_weights,
    steps_estimate,
    sweep_estimate,
    token_estimate,
    trend_estimate,
)

NOT_COMPARABLE = "not comparable"
VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_COMPARABLE)

FLATTER_RATIO = 0.05  # finding 2: |s_TV| <= 5% of |s_CE| is the paper's ">95% flatter"
TIE_POINTS = 0.5  # findings 3-4: gaps within this many points of alpha_RS cannot be told apart
TO_SPREAD_POINTS = 0.3  # finding 5: the paper's bound on the alpha_TO spread across losses (Fig. 5)
PAPER_SPEEDUP = (1.5, 1.8)  # finding 7: per-step RL speed-up of MTP + RS over no MTP (Fig. 7)
TABLE2_ORDER = ("e2e_tv", "tv", "rkl", "fkl", "ce")  # finding 3, best first; the last two tie
BLOCK_TIE = 0.005  # finding 8: accept-length gains within this many tokens per verify step cannot be told apart
LOSS_NAMES = {"ce": "CE", "fkl": "FKL", "rkl": "RKL", "tv": "TV", "e2e_tv": "e2e TV"}

__all__ = ["VERDICTS", "Finding", "HeadEval", "SweepRow", "chain_weights", "compute_findings", "findings_section",
           "findings_table"]


class HeadEval(TypedDict):
    """``bebop eval-mtp --json`` of one head at K = 3, T = 1 (values of ``head_evals``)."""

    alpha_rs: list[float]  # (K,) mean sum_v min(p, q) at draft step j
    alpha_to: list[float]  # (K,) mean p(argmax q) at draft step j
    accept_length_rs: float  # 1 + E[L] under rejection sampling
    accept_length_to: float  # 1 + E[L] under target-only verification
    accept_length_block: float  # 1 + E[L] under rejection sampling with block verification (finding 8)
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
    note: str  # the facts behind the verdict: intervals, what would decide it, by-construction checks


def _band_verdict(gaps: Sequence[tuple[str, float]]) -> tuple[str, list[str]]:
    """Verdict on "every gap > 0" when gaps within +-TIE_POINTS cannot be told apart; and the facts."""
    reversed_ = [f"{name} = {gap:+.2f} points (below −{TIE_POINTS})" for name, gap in gaps if gap < -TIE_POINTS]
    tied = [f"{name} = {gap:+.2f} points (within ±{TIE_POINTS}: cannot be told apart without per-position "
            "data; head evaluations report means only)" for name, gap in gaps if abs(gap) <= TIE_POINTS]
    verdict = NOT_REPRODUCED if reversed_ else INCONCLUSIVE if tied else REPRODUCED
    return verdict, reversed_ + tied


# --------------------------------------------------------------------------------------------
# Findings 1-2: entropy slopes
# --------------------------------------------------------------------------------------------


def _to_slope_finding(sweep: Sequence[Mapping], runs: Sequence[Run]) -> Finding:
    """Finding 1: TO accept length falls with entropy."""
    estimates = [steps_estimate(runs_with(runs, "to", CE_LOSS), "to+ce"), sweep_estimate(sweep, CE_LOSS, "to"),
                 token_estimate(runs_with(runs, None, CE_LOSS), "to")]
    index = next((i for i, e in enumerate(estimates) if e.comparable), None)
    chosen = None if index is None else estimates[index]
    ours = "; ".join(e.describe() + (" ← decides" if e is chosen else "") for e in estimates)
    args = (1, "TO accept length falls linearly with entropy", "slope −1.68 /nat, r strongly negative (Fig. 8)", ours)
    if chosen is None:
        reasons = "; ".join(f"{e.source}: {e.reason}" for e in estimates)
        return Finding(*args, NOT_COMPARABLE, f"no source gives a slope: {reasons}")
    d = decide(chosen.interval, 0.0, "below", f"the TO slope ({chosen.source}, /nat)")
    skipped = [f"{e.source}: {e.reason}" for e in estimates[:index]]
    return Finding(*args, d.verdict, "; ".join([f"decided by {chosen.source}", d.note, *skipped]))


def _flattening(ce: SlopeEstimate, tv: SlopeEstimate) -> float:
    """Percent by which the TV slope is flatter than the CE slope."""
    return 100.0 * (1.0 - abs(tv.slope) / abs(ce.slope)) if ce.slope != 0 else math.nan


def _flatness_interval(ce: SlopeEstimate, tv: SlopeEstimate) -> bootstrap.Interval:
    """|s_TV| - FLATTER_RATIO |s_CE| from the two independent bootstraps."""
    excess = abs(tv.slope) - FLATTER_RATIO * abs(ce.slope)
    draws = np.abs(tv.draws) - FLATTER_RATIO * np.abs(ce.draws)  # (B,)
    return bootstrap.percentile_interval(excess, draws, ce.interval.n + tv.interval.n, ce.interval.unit)


def _rs_flatness_finding(sweep: Sequence[Mapping], runs: Sequence[Run]) -> Finding:
    """Finding 2: RS with an e2e-TV head is >95% flatter in entropy than with a CE head."""
    pairs = [
        (steps_estimate(runs_with(runs, "rs", CE_LOSS), "rs+ce"),
         steps_estimate(runs_with(runs, "rs", TV_LOSS), "rs+e2e_tv")),
        (sweep_estimate(sweep, CE_LOSS, "rs"), sweep_estimate(sweep, TV_LOSS, "rs")),
        (token_estimate(runs_with(runs, None, CE_LOSS), "rs"), token_estimate(runs_with(runs, None, TV_LOSS), "rs")),
    ]
    index = next((i for i, (ce, tv) in enumerate(pairs) if ce.comparable and tv.comparable), None)

    def reasons(ce: SlopeEstimate, tv: SlopeEstimate) -> str:
        return "; ".join(f"{name} head: {e.reason}" for name, e in (("CE", ce), ("TV", tv)) if e.reason)

    def describe(i: int, ce: SlopeEstimate, tv: SlopeEstimate) -> str:
        if not (ce.comparable and tv.comparable):
            return f"{ce.source}: not comparable ({reasons(ce, tv)})"
        mark = " ← decides" if i == index else ""
        return (f"{ce.source}: TV {tv.interval.describe()} vs CE {ce.interval.describe()} /nat, "
                f"{_flattening(ce, tv):.0f}% flatter{mark}")

    ours = "; ".join(describe(i, *p) for i, p in enumerate(pairs))
    args = (2, "RS with a TV head is much flatter in entropy than with CE",
            "RS-TV −0.06 vs RS-CE −1.68 /nat: >95% flatter (Fig. 8)", ours)
    if index is None:
        return Finding(*args, NOT_COMPARABLE, "no source gives both slopes: " + "; ".join(
            f"{p[0].source}: {reasons(*p)}" for p in pairs))
    ce, tv = pairs[index]
    decisions = [decide(ce.interval, 0.0, "below", "the RS+CE slope (/nat; something to flatten)"),
                 decide(_flatness_interval(ce, tv), 0.0, "below", f"|TV slope| − {FLATTER_RATIO:.0%} |CE slope|")]
    skipped = [f"{p[0].source}: {reasons(*p)}" for p in pairs[:index]]
    # "Flatter" is relative to a CE decline: until that is established, the CE verdict is the finding's.
    verdict = decisions[0].verdict if decisions[0].verdict != REPRODUCED else decisions[1].verdict
    return Finding(*args, verdict, "; ".join([f"decided by {ce.source}", *(d.note for d in decisions), *skipped]))


# --------------------------------------------------------------------------------------------
# Findings 3-5 and 8: head evaluations
# --------------------------------------------------------------------------------------------


def _mean_points(evals: Mapping[str, Mapping], key: str) -> dict[str, float]:
    """100 x the mean over draft steps of evals[loss][key], for the losses that have it."""
    out = {}
    for loss, e in evals.items():
        values = [as_float(v) for v in (e.get(key) or [])]
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
    verdict, facts = _band_verdict([("e2e_tv − tv", e2e - tv), ("tv − rkl", tv - rkl),
                                    ("rkl − max(fkl, ce)", rkl - max(fkl, ce))])
    by_construction = (f"|fkl − ce| = {abs(fkl - ce):.2f} points holds by construction (soft CE and FKL have the "
                       "same gradient, q − p), so it is shown, not counted")
    return Finding(*args, ours, verdict, "; ".join([*facts, by_construction]))


def _depth_gain_finding(head_evals: Mapping[str, Mapping]) -> Finding:
    """Finding 4: alpha_RS,j(e2e_tv) − alpha_RS,j(ce) grows with the draft step j."""
    args = (4, "The e2e-TV gain over CE grows with draft depth",
            "≈ +5 points at step 3, +2.5–5 at step 2 (Fig. 4)")
    ce = [as_float(v) for v in (head_evals.get(CE_LOSS) or {}).get("alpha_rs") or []]
    tv = [as_float(v) for v in (head_evals.get(TV_LOSS) or {}).get("alpha_rs") or []]
    if len(ce) < 2 or len(ce) != len(tv) or not all(math.isfinite(v) for v in ce + tv):
        return Finding(*args, MISSING, NOT_COMPARABLE,
                       f"need alpha_RS of {CE_LOSS} and {TV_LOSS} at the same >= 2 draft steps")
    gains = [100.0 * (t - c) for t, c in zip(tv, ce)]
    ours = " / ".join(f"{g:+.1f}" for g in gains) + f" points at steps 1–{len(gains)}"
    steps = [(f"growth from step {j} to {j + 1}", gains[j] - gains[j - 1]) for j in range(1, len(gains))]
    verdict, facts = _band_verdict([*steps, (f"step-{len(gains)} gain", gains[-1])])
    return Finding(*args, ours, verdict, "; ".join(facts))


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
    note = (f"spread {spread:.2f} points {'≤' if ok else '>'} {TO_SPREAD_POINTS} (the paper's own bound; no "
            "interval: head evaluations report means only; fkl and ce match by construction)")
    return Finding(*args, ours, REPRODUCED if ok else NOT_REPRODUCED, note)


def _block_lengths(evals: Mapping[str, Mapping]) -> dict[str, tuple[float, float]] | None:
    """(token-wise, block) accept lengths of the ce and e2e_tv heads, or None when one is missing."""
    out = {}
    for loss in (CE_LOSS, TV_LOSS):
        e = evals.get(loss) or {}
        pair = (as_float(e.get("accept_length_rs", math.nan)), as_float(e.get("accept_length_block", math.nan)))
        if not all(math.isfinite(v) for v in pair):
            return None
        out[loss] = pair
    return out


def _describe_block(lengths: Mapping[str, tuple[float, float]]) -> str:
    heads = ", ".join(f"{LOSS_NAMES[k]} {t:.3f} → {b:.3f} ({b - t:+.3f})" for k, (t, b) in lengths.items())
    gain_token = lengths[TV_LOSS][0] - lengths[CE_LOSS][0]
    gain_block = lengths[TV_LOSS][1] - lengths[CE_LOSS][1]
    return f"token → block: {heads}; e2e TV − CE: token {gain_token:+.3f}, block {gain_block:+.3f}"


def _block_finding(head_evals: Mapping[str, Mapping], sweep: Sequence[Mapping]) -> Finding:
    """Finding 8: e2e-TV's accept-length gain over CE survives block verification (K = 3, T = 1)."""
    args = (8, "e2e-TV's accept-length gain over CE survives block verification",
            "not in the paper (token-wise verification); block ≥ token-wise by construction (Sun et al. 2024)")
    lengths = _block_lengths(head_evals)
    if lengths is None:
        return Finding(*args, MISSING, NOT_COMPARABLE,
                       f"need accept_length_rs and accept_length_block of {CE_LOSS} and {TV_LOSS} (eval-mtp)")
    ours = "T=1: " + _describe_block(lengths)
    for tau in sorted({r["temperature"] for r in sweep if r.get("temperature") != 1.0}):
        other = _block_lengths({r["loss"]: r for r in sweep if r["temperature"] == tau})
        ours += f"; T={tau:g}: {_describe_block(other)}" if other else ""
    gain_token = lengths[TV_LOSS][0] - lengths[CE_LOSS][0]
    gain_block = lengths[TV_LOSS][1] - lengths[CE_LOSS][1]
    verdict = REPRODUCED if gain_block > BLOCK_TIE else NOT_REPRODUCED if gain_block < -BLOCK_TIE else INCONCLUSIVE
    change = gain_block - gain_token
    trend = "is unchanged" if abs(change) <= BLOCK_TIE else "grows" if change > 0 else "shrinks"
    facts = [f"gain under block {gain_block:+.3f} vs token-wise {gain_token:+.3f} tokens per verify step: it {trend} "
             f"({change:+.3f}; ±{BLOCK_TIE} cannot be told apart: head evaluations report means only)"]
    below = [k for k, (t, b) in lengths.items() if b < t - 1e-6]
    if below:  # impossible for an exact evaluation: block accepts at least as much as token-wise
        facts.append(f"block below token-wise for {', '.join(below)}: the evaluation is wrong")
    return Finding(*args, ours, verdict, "; ".join(facts))


# --------------------------------------------------------------------------------------------
# Findings 6-7: RL runs
# --------------------------------------------------------------------------------------------


def _frozen_online_finding(runs: Sequence[Run]) -> Finding:
    """Finding 6: a frozen TV head holds acceptance; online CE updates drag it down."""
    frozen = runs_with(runs, "rs", TV_LOSS)
    online = runs_with(runs, "rs", TV_LOSS, update="online", online_loss=CE_LOSS)
    args = (6, "A frozen TV head holds acceptance; online CE drags it down",
            "frozen TV tracks the baseline; online CE decays toward RS-CE (Fig. 9a)")
    missing = [name for name, rs in (("rs+e2e_tv (frozen)", frozen), ("rs+e2e_tv with online CE", online)) if not rs]
    if missing:
        return Finding(*args, MISSING, NOT_COMPARABLE, f"no {' or '.join(missing)} run")
    f, o = summarize_run(frozen[0]), summarize_run(online[0])
    values = (f["accept_length_start"], f["accept_length_end"], o["accept_length_start"], o["accept_length_end"])
    if not all(math.isfinite(v) for v in values):
        return Finding(*args, MISSING, NOT_COMPARABLE, "a run logged no spec/accept_length")
    (tf, tf_draws), (to, to_draws) = trend_estimate(frozen), trend_estimate(online)
    diff = bootstrap.percentile_interval(tf.estimate - to.estimate, tf_draws - to_draws, tf.n + to.n, "RL steps")
    ours = (f"accept-length trend frozen {tf.describe('+.4f')}, online-CE {to.describe('+.4f')} per step; "
            f"frozen − online {diff.describe('+.4f')}; accept length frozen {values[0]:.2f} → {values[1]:.2f}, "
            f"online-CE {values[2]:.2f} → {values[3]:.2f}")
    d = decide(diff, 0.0, "above", "frozen − online-CE accept-length trend (per step)", spec="+.4f")
    return Finding(*args, ours, d.verdict, d.note)


def _speedup_finding(runs: Sequence[Run]) -> Finding:
    """Finding 7: the RL step is 1.5–1.8x faster with a frozen e2e-TV head and RS than with no MTP."""
    low, high = PAPER_SPEEDUP
    args = (7, "RL step speed-up of MTP + RS over no MTP", f"{low}–{high}× per step (Fig. 7)")
    base, frozen = none_runs(runs, async_rollout=False), runs_with(runs, "rs", TV_LOSS)  # NOTE: synchronous runs
    missing = [name for name, rs in (("none", base), ("rs+e2e_tv (frozen)", frozen)) if not rs]
    if missing:
        return Finding(*args, MISSING, NOT_COMPARABLE, f"no {' or '.join(missing)} run")
    ratio, nb, tv = step_speedup(base, frozen)
    if not (nb.estimate > 0 and tv.estimate > 0):
        return Finding(*args, MISSING, NOT_COMPARABLE, "a run logged no step_s")
    ours = f"{describe_speedup(ratio)} (none {nb.estimate:.2f} s, rs+e2e_tv {tv.estimate:.2f} s per step)"
    d = decide(ratio, low, "above", "the speed-up (×)")
    note, share = d.note, rollout_share(base)
    if d.verdict != REPRODUCED and 0 < share < 1:
        note += f"; rollout is {share:.0%} of the none step, so even free rollouts give at most {1 / (1 - share):.2f}×"
    return Finding(*args, ours, d.verdict, note)


def compute_findings(
    head_evals: Mapping[str, HeadEval], sweep: Sequence[SweepRow], runs: Sequence[Run]
) -> list[Finding]:
    """Computes one Finding per claim of the paper from measured data (see the module docstring).

    Args:
        head_evals: Draft loss name -> ``HeadEval`` (eval-mtp at K = 3, T = 1).
        sweep: ``SweepRow``s: eval-mtp of (at least) the ce and e2e_tv heads at several temperatures.
        runs: RL runs from ``runs.load_run``; their configs' mode, mtp_loss, mtp_update and
            online_loss give their roles (none, to+ce, rs+ce, rs+e2e_tv frozen, rs+e2e_tv online CE).

    Returns:
        Findings 1–8, in order. Missing inputs give ``NOT_COMPARABLE`` with the reason.
    """
    return [
        _to_slope_finding(sweep, runs),
        _rs_flatness_finding(sweep, runs),
        _rs_order_finding(head_evals),
        _depth_gain_finding(head_evals),
        _to_spread_finding(head_evals),
        _frozen_online_finding(runs),
        _speedup_finding(runs),
        _block_finding(head_evals, sweep),
    ]


FINDINGS_HEADER = ("#", "finding", "paper", "ours", "verdict")
VERDICT_LEGEND = (
    "Verdicts: **reproduced** / **not reproduced** = our 95% interval lies wholly on the paper's side of the "
    "claim / wholly on the other side; **inconclusive** = the interval contains the boundary, so this sample "
    "cannot tell the claim from its negation (the note extrapolates how many more RL steps or sequences would, "
    "by n ∝ (half-width / distance)²); **not comparable** = an input is missing. Intervals: block bootstrap over "
    "RL steps, bootstrap over sequences at token level."
)


def findings_table(findings: Sequence[Finding]) -> str:
    """A markdown table, one row per finding, the verdict legend, then one bullet per finding that has a note.

    Example:
        >>> print(findings_table([Finding(1, "c", "p", "o", REPRODUCED, "")]).splitlines()[2])
        | 1 | c | p | o | reproduced |
    """
    rows = [[str(f.number), f.claim, f.paper, f.ours, f.verdict] for f in findings]
    notes = [f"- **{f.number}** ({f.verdict}): {f.note}" for f in findings if f.note]
    return (markdown_table(FINDINGS_HEADER, rows) + "\n\n" + VERDICT_LEGEND
            + ("\n\nNotes:\n\n" + "\n".join(notes) if notes else ""))


def findings_section(findings: Sequence[Finding]) -> str:
    """The report's section on the paper: the table of the findings the data can answer (verdict other than
    not comparable), then one line per finding they cannot, saying what it needs.

    Example:
        >>> findings_section([Finding(7, "c", "p", "o", NOT_COMPARABLE, "no none run")]).splitlines()[-1]
        '- **7** c: no none run'
    """
    answered = [f for f in findings if f.verdict != NOT_COMPARABLE]
    rest = [f"- **{f.number}** {f.claim}: {f.note}" for f in findings if f.verdict == NOT_COMPARABLE]
    text = "## The paper's findings\n\n"
    if answered:
        text += ("Verdicts are computed from the data of this report, for the findings it can answer.\n\n"
                 + findings_table(answered))
    else:
        text += "These runs answer none of the paper's findings."
    if rest:
        text += "\n\nNot answered by these runs (what each needs):\n\n" + "\n".join(rest)
    return text
