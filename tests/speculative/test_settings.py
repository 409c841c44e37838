"""The one check of mode, K, temperature and top-k/top-p (``bebop.speculative.settings``, ``bebop.config``)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from bebop.config import speculate_k_problem, temperature_problem
from bebop.speculative.settings import SamplingParams, SpecConfig, check_settings, settings_problems
from bebop.utils.errors import BebopError

PACKAGE = Path(__file__).resolve().parents[2] / "bebop"


@pytest.mark.parametrize("value, greedy_ok, ok", [
    (1.0, False, True), (0.7, True, True), (2, False, True), (0.0, True, True),
    (0.0, False, False), (-0.5, True, False), (math.inf, True, False), (math.nan, True, False),
    (True, True, False), ("1", True, False), (1e-45, True, False), (0.009, False, False), (0.01, False, True),
])
def test_temperature_rule(value, greedy_ok, ok):
    """A temperature is 0 (greedy, where allowed) or at least 0.01: below it logits / T overflow float32."""
    problem = temperature_problem(value, greedy_ok)
    assert (problem is None) == ok
    if not ok and isinstance(value, float) and 0 < value < 0.01:
        assert problem.startswith(f"temperature must be {'0 (greedy) or ' if greedy_ok else ''}at least 0.01")
    elif not ok:
        assert problem.startswith("temperature must be a finite number") and (">= 0" in problem) == greedy_ok


@pytest.mark.parametrize("value, auto_ok, ok", [
    (1, False, True), (4, True, True), ("auto", True, True), ("auto", False, False),
    (0, True, False), (-2, False, False), (2.0, False, False), (True, True, False),
])
def test_speculate_k_rule(value, auto_ok, ok):
    problem = speculate_k_problem(value, auto_ok)
    assert (problem is None) == ok
    if not ok:
        assert problem.startswith("speculate_k must be an integer >= 1") and ("or 'auto'" in problem) == auto_ok


def test_settings_problems_names_every_bad_value():
    spec, sampling = SpecConfig("rs", 0, draft_temperature=-1.0), SamplingParams(-1.0, -1, 0.0, 0, ("",))
    problems = settings_problems(spec, sampling)
    assert len(problems) == 7, problems  # K, draft temperature, temperature, top-k, top-p, length, stop
    with pytest.raises(BebopError, match="speculate_k must be.*; draft_temperature must be"):
        check_settings(spec, sampling)


def test_auto_and_greedy_are_allowed_only_where_asked():
    auto = SpecConfig("auto", "auto")
    assert settings_problems(auto, SamplingParams(0.0)) == []
    assert len(settings_problems(auto, SamplingParams(0.0), greedy_ok=False, auto_ok=False)) == 3
    assert settings_problems(SpecConfig("none", 0), None) == []  # mode none ignores K
    assert settings_problems(SpecConfig("rs", "auto"), None, auto_ok=False) == [
        "speculate_k must be an integer >= 1, got 'auto'"]


def test_no_module_writes_its_own_temperature_or_k_rule():
    """Every temperature and K check goes through ``temperature_problem`` / ``speculate_k_problem``."""
    own_rule = re.compile(r"(temperature|speculate_k)\s*(<=|<|>)\s*[01]\b|[01]\s*(<|<=)\s*\w*temperature")
    offenders = [f"{path.relative_to(PACKAGE)}:{n}" for path in PACKAGE.rglob("*.py")
                 for n, line in enumerate(path.read_text().splitlines(), 1)
                 if own_rule.search(line) and re.match(r"\s*(el)?if ", line) and path.name != "config.py"]
    assert offenders == []


def test_needs_an_mtp_head_is_one_rule():
    """``needs_head`` / ``head_problem``: the CLI, the engine, the auto wing, check-lossless, the RL loop, the TRL
integration and the vLLM backend ask here; a library caller names its own way to give a head."""
    from bebop.speculative.settings import head_problem, needs_head

    assert [needs_head(m) for m in ("none", "to", "rs", "auto")] == [False, True, True, True]
    assert needs_head("none", "online") and head_problem("none", has_head=False) is None
    assert head_problem("rs", has_head=False) == "mode 'rs' needs an MTP head (--mtp)"
    assert head_problem("none", False, "online") == "mode 'none' with mtp_update online needs an MTP head (--mtp)"
    assert head_problem("rs", has_head=True) is None
    assert head_problem("to", False, given_by="head=MtpHead") == "mode 'to' needs an MTP head (head=MtpHead)"
