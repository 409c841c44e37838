"""Tests for bebop.check.verdict: three verdicts with their own exit codes, and the verdict first in the report."""

from __future__ import annotations

import dataclasses

import pytest

from bebop.check.lossless import LosslessCheck
from bebop.check.verdict import VERDICT_EXIT_CODES, format_lossless_table, summarize_checks


def _check(name: str, p_value: float, informative: bool = True) -> LosslessCheck:
    check = LosslessCheck(name=name, mode="rs", speculate_k=3, temperature=1.0, top_k=0, top_p=1.0, statistic=1.5,
                          dof=4, p_value=p_value, passed=p_value > 1e-3, token=2, alpha=1e-3)
    return check if informative else dataclasses.replace(check, statistic=0.0, dof=0, p_value=1.0, passed=True)


@pytest.mark.parametrize("checks, verdict, first_line", [
    ([_check("a", 0.5), _check("b", 0.3)], "lossless",
     "LOSSLESS: 2 of 2 informative checks pass on 1 tested prompt (0 uninformative)."),
    ([_check("a", 0.5), _check("b", 1e-9)], "not lossless", "NOT LOSSLESS: 1 of 2 informative checks fail on 1 tested prompt."),
    ([_check("a", 0.5), _check("f", 1.0, False), _check("g", 1.0, False)], "inconclusive",
     "INCONCLUSIVE: only 1 of 3 checks are informative (fewer than 50%), none fails, on 1 tested prompt"),
    ([_check("b", 1e-9), _check("f", 1.0, False), _check("g", 1.0, False)], "not lossless", "NOT LOSSLESS: 1 of 1"),
    ([_check("a", 0.5), _check("f", 1.0, False)], "lossless", "LOSSLESS: 1 of 1"),  # half informative is enough
])
def test_not_enough_information_is_not_a_failure(checks, verdict, first_line):
    """A failed check means not lossless (exit 1); too few informative checks means inconclusive, another code."""
    summary = summarize_checks(checks)
    assert summary.verdict == verdict and summary.passed == (verdict == "lossless")
    assert VERDICT_EXIT_CODES == {"lossless": 0, "not lossless": 1, "inconclusive": 3}
    assert format_lossless_table(checks).splitlines()[0].startswith(first_line)


def test_the_report_opens_with_the_verdict_and_ends_with_the_false_alarm_odds():
    checks = [_check("a", 0.5), _check("b", 1e-9), _check("flat", 1.0, False)]
    lines = format_lossless_table(checks, prompts=["Q 1 + 2 = ?", [5, 6], "Q 3"], num_tested=2).splitlines()
    assert lines[0].startswith("NOT LOSSLESS") and lines[1] == ""
    assert lines[2] == "Tested prompts: 'Q 1 + 2 = ?'; token ids [5, 6]; only mixed into batches: 'Q 3'."
    assert "| a | rs | 3 | 1 | off | off | 1.50 | 4 | 0.5 | pass |" in lines
    assert "| flat | rs | 3 | 1 | off | off | 0.00 | 0 | 1 | uninformative |" in lines
    assert "FAILING configurations (1): b." in lines
    assert "3 checks: 2 informative, 1 uninformative (dof 0: every sample in one cell, nothing compared); 1 of 2 " \
           "informative checks passed." in lines
    assert lines[-1].startswith("False-alarm odds:") and "1 - (1 - 0.001)^2 = 0.20%" in lines[-1]  # informative only
    assert format_lossless_table([]) == "No lossless checks were run."
