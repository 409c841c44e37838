"""Tests for bebop.check.verdict: three verdicts with their own exit codes, the retest procedure (only an
event that fails on first samples and again on fresh ones counts), and the verdict first in the report."""

from __future__ import annotations

import dataclasses

import pytest

from bebop.check.lossless import LosslessCheck
from bebop.check.verdict import (
    VERDICT_EXIT_CODES,
    events_to_retest,
    false_alarm_bound,
    format_lossless_table,
    retest_seed,
    summarize_checks,
)


def _check(name: str, p_value: float, informative: bool = True, **fields) -> LosslessCheck:
    check = LosslessCheck(name=name, mode="rs", speculate_k=3, temperature=1.0, top_k=0, top_p=1.0, statistic=1.5,
                          dof=4, p_value=p_value, passed=p_value > 1e-3, token=2, alpha=1e-3)
    check = dataclasses.replace(check, **fields)
    return check if informative else dataclasses.replace(check, statistic=0.0, dof=0, p_value=1.0, passed=True)


@pytest.mark.parametrize("checks, verdict, first_line", [
    ([_check("a", 0.5), _check("b", 0.3)], "lossless",
     "LOSSLESS: 2 of 2 informative checks pass on 1 tested prompt (0 uninformative)."),
    ([_check("a", 0.5), _check("b", 1e-9)], "not lossless", "NOT LOSSLESS: 1 failing setting on 1 tested prompt "
     "(1 of 2 informative checks fail on first samples; a failure counts when its retest on fresh samples fails too)."),
    ([_check("a", 0.5), _check("f", 1.0, False), _check("g", 1.0, False)], "inconclusive",
     "INCONCLUSIVE: only 1 of 3 checks are informative (fewer than 50%), none fails twice, on 1 tested prompt"),
    ([_check("b", 1e-9), _check("f", 1.0, False), _check("g", 1.0, False)], "not lossless", "NOT LOSSLESS: 1 failing"),
    ([_check("a", 0.5), _check("f", 1.0, False)], "lossless", "LOSSLESS: 1 of 1"),  # half informative is enough
])
def test_not_enough_information_is_not_a_failure(checks, verdict, first_line):
    """A failed check nobody retested means not lossless (exit 1, fail closed); too few informative checks means
    inconclusive, another code."""
    summary = summarize_checks(checks)
    assert summary.verdict == verdict and summary.passed == (verdict == "lossless")
    assert VERDICT_EXIT_CODES == {"lossless": 0, "not lossless": 1, "inconclusive": 3}
    assert format_lossless_table(checks).splitlines()[0].startswith(first_line)


FIRST = [_check("rs K=3 T=1, token 4", 1e-5), _check("rs K=3 T=1, token 5", 0.4),
         _check("to K=1 T=1, token 4", 2e-4), _check("rs K=1 T=0.7, token 2", 0.6, temperature=0.7)]


def test_a_failure_then_a_pass_on_the_retest_is_lossless():
    """Two settings failing against one plain sample are one event; its retest passes: a chance failure."""
    retest = [dataclasses.replace(c, retest=True, p_value=0.3, passed=True) for c in FIRST[:3]]
    s = summarize_checks(FIRST + retest)
    assert s.verdict == "lossless" and s.cleared == ("rs K=3 T=1", "to K=1 T=1") and not s.failing
    assert s.num_checks == 4 and s.num_failed == 2 and sorted(s.event_sizes) == [1, 3]
    assert events_to_retest(FIRST) == {(0, "", 1.0, 0, 1.0): {"rs K=3 T=1", "to K=1 T=1"}}
    report = format_lossless_table(FIRST + retest, seed=7).splitlines()
    assert report[0] == "LOSSLESS: 2 of 4 informative checks pass on 1 tested prompt (0 uninformative; 2 failed once " \
                        "and passed the retest)."
    assert report[1].startswith(f"Retested on fresh samples (seed {retest_seed(7)}): rs K=3 T=1; to K=1 T=1. One "
                                "failure is a chance event")
    assert "| rs K=3 T=1, token 4 (retest) | rs | 3 | 1 | off | off | 1.50 | 4 | 0.3 | pass |" in report


@pytest.mark.parametrize("failing_retest", [0, 2])
def test_two_failures_are_not_lossless(failing_retest):
    """The event fails again on fresh samples, at the same check or at another check of the same event."""
    retest = [dataclasses.replace(c, retest=True, p_value=1e-6 if i == failing_retest else 0.5,
                                  passed=i != failing_retest) for i, c in enumerate(FIRST[:3])]
    s = summarize_checks(FIRST + retest)
    assert s.verdict == "not lossless" and s.failing == ("rs K=3 T=1", "to K=1 T=1")
    report = format_lossless_table(FIRST + retest).splitlines()
    assert report[1].startswith("What it means: an exact sampler fails an event twice with odds at most")
    assert report[2].startswith("Next: roll out with --mode none until it is fixed")
    assert "FAILING configurations (2): rs K=3 T=1; to K=1 T=1." in report


def test_another_events_retest_does_not_clear_a_failure():
    """A pass on another plain sample (T = 0.7, or another prompt) says nothing about the failed event."""
    others = [dataclasses.replace(FIRST[3], retest=True), dataclasses.replace(FIRST[0], retest=True, p_value=0.5,
                                                                                passed=True, prompt=1)]
    assert summarize_checks(FIRST + others).verdict == "not lossless"


def test_a_crash_fails_without_a_retest():
    crash = _check("rs K=2 T=1, sampling raised RuntimeError: boom", 0.0, kind="crash", dof=1)
    assert events_to_retest([crash]) == {}
    s = summarize_checks([*FIRST[1:2], crash])
    assert s.verdict == "not lossless" and s.failing == ("rs K=2 T=1",)


def test_false_alarm_bound():
    """sum_e (alpha n_e)^2: below 1e-3 for the defaults' events (3 tested prompts x 26, 27 and 20 checks)."""
    assert false_alarm_bound(3e-4, [26, 27, 20] * 3) == pytest.approx(3 * ((7.8e-3) ** 2 + (8.1e-3) ** 2 + 6e-3 ** 2))
    assert false_alarm_bound(3e-4, [26, 27, 20] * 3) < 1e-3
    assert false_alarm_bound(0.5, [4]) == 1.0  # odds, capped at 1 per event
    assert summarize_checks(FIRST).false_alarm_bound == pytest.approx((3e-3) ** 2 + 1e-6)


def test_the_report_opens_with_the_verdict_and_ends_with_the_false_alarm_odds():
    checks = [_check("a", 0.5), _check("b", 1e-9, top_k=5), _check("flat", 1.0, False)]
    lines = format_lossless_table(checks, prompts=["Q 1 + 2 = ?", [5, 6], "Q 3"], num_tested=2).splitlines()
    assert lines[0].startswith("NOT LOSSLESS") and lines[3] == ""
    assert lines[4] == "Tested prompts: 'Q 1 + 2 = ?'; token ids [5, 6]; only mixed into batches: 'Q 3'."
    assert "| a | rs | 3 | 1 | off | off | 1.50 | 4 | 0.5 | pass |" in lines
    assert "| flat | rs | 3 | 1 | off | off | 0.00 | 0 | 1 | uninformative |" in lines
    assert "FAILING configurations (1): b." in lines
    assert "3 checks: 2 informative, 1 uninformative (dof 0: every sample in one cell, nothing compared); 1 of 2 " \
           "informative checks passed on first samples." in lines
    assert lines[-1].startswith("False-alarm odds:") and "the 2 plain samples compared against are 2 events" in lines[-1]
    assert "sum_e (alpha * n_e)^2 = 5e-06" in lines[-1]  # events of 2 (a, flat) and 1 (b) checks at alpha 1e-3
    assert format_lossless_table([]) == "No lossless checks were run."
