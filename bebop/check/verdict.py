"""The results of the lossless checks (``bebop.check.lossless``), their verdict, and the report
``bebop check-lossless`` prints.

Three verdicts, each with its exit code: lossless (0: no informative check fails, and at least
half the checks are informative), not lossless (1: an informative check fails), inconclusive (3:
none fails, but too few compared anything). The verdict is the report's first line.
"""

from __future__ import annotations

from dataclasses import dataclass

from bebop.check.config import DEFAULT_ALPHA

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
    kind: str = "marginal"  # which entry of CHECK_KINDS made it
    tokens: tuple[int, ...] = ()  # the generated tokens compared (1-based): (i,) or a joint (i, j)
    prompt: int = 0  # which tested prompt (0-based index into the prompts)

    @property
    def informative(self) -> bool:
        """Compared something: at least two cells after pooling (dof >= 1)."""
        return self.dof >= 1

    @property
    def result(self) -> str:
        return "uninformative" if not self.informative else "pass" if self.passed else "FAIL"


def false_alarm_odds(alpha: float, num_checks: int) -> float:
    """Chance that at least one of ``num_checks`` checks fails by chance: 1 - (1 - alpha)^m.

    Example: false_alarm_odds(1e-3, 21) ~= 0.0208.
    """
    return 1.0 - (1.0 - alpha) ** num_checks


@dataclass(frozen=True)
class LosslessSummary:
    """The verdict of a set of checks."""

    num_checks: int
    num_informative: int  # dof >= 1
    num_failed: int  # informative checks with p <= alpha
    alpha: float  # the largest per-check alpha

    @property
    def enough_informative(self) -> bool:
        return self.num_checks > 0 and self.num_informative >= MIN_INFORMATIVE_SHARE * self.num_checks

    @property
    def verdict(self) -> str:
        """NOT_LOSSLESS when an informative check failed; INCONCLUSIVE when none did but fewer than half
        the checks were informative (nothing much was compared); LOSSLESS otherwise."""
        if self.num_failed:
            return NOT_LOSSLESS
        return LOSSLESS if self.enough_informative else INCONCLUSIVE

    @property
    def passed(self) -> bool:
        """The verdict is LOSSLESS."""
        return self.verdict == LOSSLESS


def summarize_checks(checks: list[LosslessCheck]) -> LosslessSummary:
    informative = [c for c in checks if c.informative]
    return LosslessSummary(len(checks), len(informative), sum(not c.passed for c in informative),
                           max((c.alpha for c in checks), default=DEFAULT_ALPHA))


def describe_prompt(prompt) -> str:
    return repr(prompt) if isinstance(prompt, str) else "token ids " + repr(list(prompt))


def verdict_line(summary: LosslessSummary, num_tested: int = 1) -> str:
    """The answer, first: the verdict in capitals and the counts behind it.

    Example: "LOSSLESS: 72 of 72 informative checks pass on 1 tested prompt (3 uninformative)."
    """
    s, prompts = summary, f"{num_tested} tested prompt{'s' if num_tested != 1 else ''}"
    if s.verdict == NOT_LOSSLESS:
        return f"NOT LOSSLESS: {s.num_failed} of {s.num_informative} informative checks fail on {prompts}."
    if s.verdict == INCONCLUSIVE:
        return (f"INCONCLUSIVE: only {s.num_informative} of {s.num_checks} checks are informative (fewer than "
                f"{MIN_INFORMATIVE_SHARE:.0%}), none fails, on {prompts}: the prompts' continuations are too nearly "
                "deterministic to test much; give --prompts whose continuations branch early.")
    return (f"LOSSLESS: {s.num_informative} of {s.num_informative} informative checks pass on {prompts} "
            f"({s.num_checks - s.num_informative} uninformative).")


def format_lossless_table(checks: list[LosslessCheck], prompts: list | None = None, num_tested: int = 1) -> str:
    """The verdict (``verdict_line``), the prompts used (if given), a markdown table of the checks, the
    failing configurations, and the false-alarm odds."""
    if not checks:
        return "No lossless checks were run."
    s = summarize_checks(checks)
    lines = [verdict_line(s, num_tested), ""]
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
        lines.append(
            f"| {c.name} | {c.mode} | {c.speculate_k} | {c.temperature:g} | {top_k} | {top_p} | {c.statistic:.2f} | "
            f"{c.dof} | {c.p_value:.3g} | {c.result} |"
        )
    m, alpha = s.num_informative, s.alpha
    lines.append("")
    failed = [c for c in checks if c.informative and not c.passed]
    if failed:
        configs = list(dict.fromkeys(c.name.split(", ")[0] for c in failed))
        lines.append(f"FAILING configurations ({len(configs)}): " + "; ".join(configs) + ".")
    lines.append(f"{s.num_checks} checks: {m} informative, {s.num_checks - m} uninformative (dof 0: every sample in "
                 f"one cell, nothing compared); {m - s.num_failed} of {m} informative checks passed.")
    lines.append(
        f"False-alarm odds: each informative check fails by chance with probability alpha = {alpha:g} when the "
        f"sampler is exact, so with m = {m} informative checks the chance of at least one false alarm is "
        f"1 - (1 - {alpha:g})^{m} = {false_alarm_odds(alpha, m):.2%}."
    )
    return "\n".join(lines)
