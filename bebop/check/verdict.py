"""The results of the lossless checks (``bebop.check.lossless``), their verdict, and the report
``bebop check-lossless`` prints.

Events: every check compares a speculative sample with one plain sample (a tested prompt's plain
sampling at one temperature/top-k/top-p, from one reference sampler), and the checks that share
a plain sample fail together when that sample happens to be unusual, so they are one event
(``LosslessCheck.event``). The procedure:

1. Every check runs on first samples (seed s) at the per-check false-alarm odds ``alpha``.
2. An event with a failing check is retested: its plain sample and its failing settings are drawn
   afresh under another seed (``retest_seed``) and checked again; uninformative first checks and
   events that passed are not rerun.
3. An event fails when it fails on both: on the retest, any check of it may fail. A setting whose
   sampling crashed fails without a retest (a crash is no chance event), and so does a failing event
   nobody retested.

Three verdicts, each with its exit code: lossless (0: no event fails, and at least half the first
checks are informative), not lossless (1: an event fails), inconclusive (3: none fails, but too few
checks compared anything). The verdict is the report's first line.

False-alarm odds (``false_alarm_bound``): an exact sampler fails event e's first checks with odds
at most alpha * n_e (n_e checks, the union bound) and, the retest's samples being independent of
the first ones, fails its retest with odds at most alpha * n_e again, so it is called not lossless
with odds at most sum_e (alpha * n_e)^2 (0.05% for the defaults' 9 events of 20 to 27 checks, against
1 - (1 - alpha)^m ~= 6% with m ~= 200 checks and no retest).
"""

from __future__ import annotations

from dataclasses import dataclass

from bebop.check.config import DEFAULT_ALPHA

RETEST_SEED_SHIFT = 1 << 32  # retests draw under seed + this: (seed, step) pairs no first sample used
MIN_INFORMATIVE_SHARE = 0.5  # fewer informative checks than this share: the run is inconclusive
LOSSLESS, NOT_LOSSLESS, INCONCLUSIVE = "lossless", "not lossless", "inconclusive"  # the verdicts
VERDICT_EXIT_CODES = {LOSSLESS: 0, NOT_LOSSLESS: 1, INCONCLUSIVE: 3}  # 2 is taken: bad input, as every command


@dataclass(frozen=True)
class LosslessCheck:
    """One two-sample chi-square test: speculative vs plain distribution of one token (or token pair)."""

    name: str  # e.g. "rs K=3 T=1 top-k=20 top-p=0.9 mixed, token 2"
    mode: str  # to | rs
    speculate_k: int  # K (0 for plain sampling)
    temperature: float  # of the target (q is drawn at the same temperature)
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    statistic: float  # Pearson's chi-square
    dof: int  # cells - 1 (0: both samples are one token, nothing to compare; p = 1)
    p_value: float  # P(chi2_dof >= statistic) under exactness
    passed: bool  # p_value > alpha (true for an uninformative check, which cannot fail)
    token: int = 1  # which generated token, 1-based (the first of ``tokens``)
    batch_mix: bool = False  # the speculative rows were mixed with other prompts' rows
    alpha: float = DEFAULT_ALPHA  # the false-alarm odds this check was run at
    kind: str = "marginal"  # which entry of CHECK_KINDS made it ("crash": the setting's sampling raised)
    tokens: tuple[int, ...] = ()  # the generated tokens compared (1-based): (i,) or a joint (i, j)
    prompt: int = 0  # which tested prompt (0-based index into the prompts)
    reference: str = ""  # the plain sampler compared against, when there are several (e.g. "vLLM plain")
    retest: bool = False  # drawn on fresh samples because this check's event failed on its first ones

    @property
    def informative(self) -> bool:
        """Compared something: at least two cells after pooling (dof >= 1)."""
        return self.dof >= 1

    @property
    def failed(self) -> bool:
        """An informative check whose p-value is at most alpha."""
        return self.informative and not self.passed

    @property
    def event(self) -> tuple:
        """The plain sample compared against: (tested prompt, reference, temperature, top-k, top-p)."""
        return (self.prompt, self.reference, self.temperature, self.top_k, self.top_p)

    @property
    def result(self) -> str:
        return "uninformative" if not self.informative else "pass" if self.passed else "FAIL"


def retest_seed(seed: int) -> int:
    """The seed a failing event's retest draws under: every (seed, step) it uses is new to the run."""
    return seed + RETEST_SEED_SHIFT


def events_to_retest(checks: list[LosslessCheck]) -> dict[tuple, set[str]]:
    """Failing events of first checks -> the names of their settings that failed (a crash is not retested).

    Example: checks of "rs K=3 T=1" failing at tokens 4 and 7 -> {(0, "", 1.0, 0, 1.0): {"rs K=3 T=1"}}.
    """
    out: dict[tuple, set[str]] = {}
    for c in checks:
        if c.failed and not c.retest and c.kind != "crash":
            out.setdefault(c.event, set()).add(setting_name(c))
    return out


def setting_name(check: LosslessCheck) -> str:
    """The setting a check belongs to: its name up to the first comma, less the reference ("rs K=3 T=1 mixed")."""
    return check.name.split(", ")[0].split(" vs ")[0]


def false_alarm_odds(alpha: float, num_checks: int) -> float:
    """Chance that at least one of ``num_checks`` independent checks fails by chance: 1 - (1 - alpha)^m.

    Example: false_alarm_odds(1e-3, 21) ~= 0.0208.
    """
    return 1.0 - (1.0 - alpha) ** num_checks


def false_alarm_bound(alpha: float, event_sizes: list[int]) -> float:
    """Upper bound on an exact sampler's odds of failing some event twice: sum_e min(1, alpha * n_e)^2.

    Each event's first checks fail with odds at most alpha * n_e (the union bound, which holds although
    they share samples), its retest, on independent samples, with odds at most alpha * n_e again.

    Example: false_alarm_bound(3e-4, [26, 27, 20]) ~= 1.62e-4.
    """
    return sum(min(1.0, alpha * n) ** 2 for n in event_sizes)


@dataclass(frozen=True)
class LosslessSummary:
    """The verdict of a set of checks (first checks and retests)."""

    num_checks: int  # first checks
    num_informative: int  # first checks with dof >= 1
    num_failed: int  # informative first checks with p <= alpha
    alpha: float  # the largest per-check alpha
    event_sizes: tuple[int, ...] = ()  # first checks per event
    cleared: tuple[str, ...] = ()  # settings that failed once and passed the retest ("prompt 1: rs K=3 T=1")
    failing: tuple[str, ...] = ()  # settings whose event failed twice, crashed, or failed with no retest

    @property
    def enough_informative(self) -> bool:
        return self.num_checks > 0 and self.num_informative >= MIN_INFORMATIVE_SHARE * self.num_checks

    @property
    def verdict(self) -> str:
        """NOT_LOSSLESS when an event failed (twice); INCONCLUSIVE when none did but fewer than half the
        checks were informative (nothing much was compared); LOSSLESS otherwise."""
        if self.failing:
            return NOT_LOSSLESS
        return LOSSLESS if self.enough_informative else INCONCLUSIVE

    @property
    def passed(self) -> bool:
        """The verdict is LOSSLESS."""
        return self.verdict == LOSSLESS

    @property
    def false_alarm_bound(self) -> float:
        return false_alarm_bound(self.alpha, list(self.event_sizes))


def _label(check: LosslessCheck, num_prompts: int) -> str:
    against = f" vs {check.reference}" if check.reference else ""
    return (f"prompt {check.prompt + 1}: " if num_prompts > 1 else "") + setting_name(check) + against


def summarize_checks(checks: list[LosslessCheck]) -> LosslessSummary:
    """The verdict of first checks and retests, by the procedure of the module docstring."""
    first = [c for c in checks if not c.retest]
    sizes: dict[tuple, int] = {}
    for c in first:
        sizes[c.event] = sizes.get(c.event, 0) + 1
    num_prompts = len({c.prompt for c in checks})
    retested = {c.event for c in checks if c.retest}
    failed_again = {c.event for c in checks if c.retest and c.failed}
    cleared, failing = [], []
    for c in first:
        if c.kind == "crash" or (c.failed and (c.event not in retested or c.event in failed_again)):
            failing.append(_label(c, num_prompts))
        elif c.failed:
            cleared.append(_label(c, num_prompts))
    return LosslessSummary(len(first), sum(c.informative for c in first), sum(c.failed for c in first),
                           max((c.alpha for c in checks), default=DEFAULT_ALPHA), tuple(sizes.values()),
                           tuple(dict.fromkeys(cleared)), tuple(dict.fromkeys(failing)))

def describe_prompt(prompt) -> str:
    return repr(prompt) if isinstance(prompt, str) else "token ids " + repr(list(prompt))


def verdict_line(summary: LosslessSummary, num_tested: int = 1) -> str:
    """The answer, first: the verdict in capitals and the counts behind it.

    Example: "LOSSLESS: 72 of 72 informative checks pass on 1 tested prompt (3 uninformative)."
    """
    s, prompts = summary, f"{num_tested} tested prompt{'s' if num_tested != 1 else ''}"
    if s.verdict == NOT_LOSSLESS:
        return (f"NOT LOSSLESS: {len(s.failing)} failing setting{'s' if len(s.failing) != 1 else ''} on {prompts} "
                f"({s.num_failed} of {s.num_informative} informative checks fail on first samples; a failure counts "
                "when its retest on fresh samples fails too).")
    if s.verdict == INCONCLUSIVE:
        return (f"INCONCLUSIVE: only {s.num_informative} of {s.num_checks} checks are informative (fewer than "
                f"{MIN_INFORMATIVE_SHARE:.0%}), none fails twice, on {prompts}: the prompts' continuations are too "
                "nearly deterministic to test much; give --prompts whose continuations branch early.")
    passed = s.num_informative - s.num_failed
    return (f"LOSSLESS: {passed} of {s.num_informative} informative checks pass on {prompts} "
            f"({s.num_checks - s.num_informative} uninformative"
            + (f"; {s.num_failed} failed once and passed the retest)." if s.num_failed else ")."))


def _meaning(s: LosslessSummary, seed_note: str) -> list[str]:
    """What the verdict means and what to try next (one or two lines)."""
    bound = f"1 run in {1 / max(s.false_alarm_bound, 1e-12):,.0f}"
    if s.verdict == NOT_LOSSLESS:
        return [f"What it means: an exact sampler fails an event twice with odds at most {bound}, so speculative "
                "sampling with these settings draws from another distribution than plain sampling (or crashed).",
                "Next: roll out with --mode none until it is fixed; rerun with another --seed to see the same "
                "settings fail, and report this table with the model's config.json and the head's mtp_config.json."]
    if s.cleared:
        return [f"Retested on fresh samples{seed_note}: {'; '.join(s.cleared)}. One failure is a chance event "
                f"an exact sampler gives in about {false_alarm_odds(s.alpha, s.num_informative):.1%} of runs; "
                f"only a repeated one counts (odds at most {bound})."]
    return []


def format_lossless_table(checks: list[LosslessCheck], prompts: list | None = None, num_tested: int = 1,
                          seed: int | None = None) -> str:
    """The verdict (``verdict_line``), what it means, the prompts used (if given), a markdown table of the
    checks (retests last), the failing settings, and the false-alarm odds."""
    if not checks:
        return "No lossless checks were run."
    s = summarize_checks(checks)
    seed_note = f" (seed {retest_seed(seed)})" if seed is not None else ""
    lines = [verdict_line(s, num_tested), *_meaning(s, seed_note), ""]
    if prompts:
        tested = "; ".join(describe_prompt(p) for p in prompts[:num_tested])
        others = ", ".join(describe_prompt(p) for p in prompts[num_tested:]) or "none"
        lines += [f"Tested prompt{'s' if num_tested > 1 else ''}: {tested}; only mixed into batches: {others}.", ""]
    lines += [
        "| check | mode | K | T | top-k | top-p | chi2 | dof | p-value | result |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        top_k = str(c.top_k) if c.top_k else "off"
        top_p = f"{c.top_p:g}" if c.top_p < 1 else "off"
        name = c.name + (" (retest)" if c.retest else "")
        lines.append(
            f"| {name} | {c.mode} | {c.speculate_k} | {c.temperature:g} | {top_k} | {top_p} | {c.statistic:.2f} | "
            f"{c.dof} | {c.p_value:.3g} | {c.result} |"
        )
    m, alpha = s.num_informative, s.alpha
    lines.append("")
    if s.failing:
        lines.append(f"FAILING configurations ({len(s.failing)}): " + "; ".join(s.failing) + ".")
    lines.append(f"{s.num_checks} checks: {m} informative, {s.num_checks - m} uninformative (dof 0: every sample in "
                 f"one cell, nothing compared); {m - s.num_failed} of {m} informative checks passed on first samples.")
    lines.append(
        f"False-alarm odds: each informative check fails by chance with probability alpha = {alpha:g} when the "
        f"sampler is exact, and the {len(s.event_sizes)} plain samples compared against are {len(s.event_sizes)} "
        f"events; an event failing on first samples is retested on fresh ones and only a repeated failure counts, "
        f"so an exact sampler is called not lossless with odds at most sum_e (alpha * n_e)^2 = {s.false_alarm_bound:.3g} "
        f"(n_e: the checks of event e)."
    )
    return "\n".join(lines)
