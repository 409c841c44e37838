"""Tests for bebop.rl.rewards: answer extraction, matching, math_reward, load_reward."""

import sys
import textwrap

import pytest

from bebop.rl.rewards import (
    REWARDS,
    answers_match,
    call_reward,
    extract_final_answer,
    load_reward,
    math_reward,
    resume_reward,
)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),  # GSM8K reference format
        ("#### 1,234", "1234"),  # thousands commas
        ("#### $18.00", "18"),  # dollar sign and .00
        ("#### -12", "-12"),  # negative
        ("#### 72 apples", "72"),  # trailing unit after the marker
        ("12 then 7 #### 5 and then 9", "5"),  # #### beats a later number
        ("so the result is \\boxed{42}.", "42"),
        ("first \\boxed{1} then \\boxed{2}", "2"),  # last box wins
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces, kept as a string
        ("\\boxed{\\dfrac{3}{4}}", "\\frac{3}{4}"),  # dfrac normalised to frac
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}"),
        ("\\boxed{1,000}", "1000"),
        ("3 steps. The answer is 17.", "17"),
        ("The final answer: -4.5 dollars", "-4.5"),
        ("The answer is $\\frac{1}{2}$.", "\\frac{1}{2}"),
        ("I think 3 and then 4, so 5.", "5"),  # last-number fallback, trailing period
        ("a share of 3/4 of the pie", "3/4"),  # simple fraction kept whole
        ("it drops to +7", "7"),  # leading plus
        ("costs $2,500.50 in total", "2500.5"),
        ("the rate is 50%", "50"),
        ("x = -0.0", "0"),
        ("a .5 chance", "0.5"),
        ("10-3", "3"),  # a minus glued to a number is subtraction, not a sign
        ("temperature fell to \u22123", "-3"),  # unicode minus
        ("no digits at all", None),
        ("", None),
        ("\\boxed{", None),  # unclosed box and no number
    ],
)
def test_extract_final_answer(text, expected):
    assert extract_final_answer(text) == expected


@pytest.mark.parametrize(
    "predicted, reference, expected",
    [
        ("72", "72", True),
        ("72", "72.0", True),
        ("1234", "1,234", True),
        ("18", "$18.00", True),
        ("-12", "-12", True),
        ("12", "-12", False),
        ("0.75", "3/4", True),
        ("\\frac{3}{4}", "0.75", True),
        ("\\frac{1}{2}", "\\frac{1}{2}", True),
        ("\\frac{\\pi}{2}", "\\frac{\\pi}{2}", True),  # not a number: string compare
        ("\\frac{\\pi}{2}", "\\frac{\\pi}{3}", False),
        ("\\frac{1}{2}", "\\dfrac{1}{2}", True),
        ("\\sqrt{2}", "\\sqrt{2}", True),
        ("\\sqrt{2}", "\\sqrt{3}", False),
        ("0.333", "1/3", False),  # tolerance is for formatting, not rounding
        ("0.1", "0.10000000001", True),
        ("0", "0.0", True),
        ("Yes", "yes", True),
        ("7", "seven", False),
        (None, "1", False),
        ("5", 5, True),  # a numeric reference from JSON
    ],
)
def test_answers_match(predicted, reference, expected):
    assert answers_match(predicted, reference) is expected


def test_math_reward_scores_each_completion():
    completions = [
        "6 * 12 = 72\n#### 72",
        "The answer is \\boxed{70}",
        "I do not know.",
        "So she sold 1,200 clips.",
    ]
    answers = ["72", "72", "72", "Step by step... 600 + 600 = 1200\n#### 1,200"]
    rewards = math_reward(["q"] * 4, completions, answer=answers, other_field=[0] * 4)
    assert rewards == [1.0, 0.0, 0.0, 1.0]


def test_math_reward_checks_lengths():
    with pytest.raises(ValueError, match="2 completions but 1 answers"):
        math_reward(["q", "q"], ["1", "2"], answer=["1"])


def _write_module(tmp_path, name="my_reward.py"):
    path = tmp_path / name
    path.write_text(
        textwrap.dedent(
            """
            NOT_CALLABLE = 3

            def length_reward(prompts, completions, **_):
                return [float(len(c)) for c in completions]
            """
        )
    )
    return path


def test_load_reward_builtin_and_dotted():
    assert load_reward("math") is REWARDS["math"] is math_reward
    assert load_reward("bebop.rl.rewards:math_reward") is math_reward


def test_load_reward_from_file(tmp_path):
    path = _write_module(tmp_path)
    fn = load_reward(f"{path}:length_reward")
    assert fn(["p", "p"], ["ab", "abcd"]) == [2.0, 4.0]


def test_load_reward_from_module_on_sys_path(tmp_path, monkeypatch):
    _write_module(tmp_path, "bebop_test_reward_mod.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    fn = load_reward("bebop_test_reward_mod:length_reward")
    assert fn([], ["abc"]) == [3.0]


def test_load_reward_from_the_current_directory(tmp_path, monkeypatch):
    """`--reward my_rewards:score` works from the folder holding my_rewards.py, as `python -m` would."""
    _write_module(tmp_path, "bebop_cwd_reward_mod.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    path_before = list(sys.path)
    assert load_reward("bebop_cwd_reward_mod:length_reward")([], ["ab"]) == [2.0]
    assert sys.path == path_before  # the directory was added for the import only


def _raises(prompts, completions, **_):
    return [1 / 0 for _ in completions]


def _returns_none(prompts, completions, **_):
    return None


def _returns_nan(prompts, completions, **_):
    return [float("nan")] + [1.0] * (len(completions) - 1)


def _returns_inf(prompts, completions, **_):
    return [1.0, float("inf")]


def _returns_one(prompts, completions, **_):
    return [1.0]


def _no_fields(prompts, completions):
    return [1.0] * len(completions)


def _exits(prompts, completions, **_):
    raise SystemExit(0)


def _interrupted(prompts, completions, **_):
    raise KeyboardInterrupt


@pytest.mark.parametrize("fn, fields, message", [
    (_raises, {}, "reward function _raises raised ZeroDivisionError: division by zero"),
    (_returns_none, {}, "reward function _returns_none must return a list of numbers, got NoneType"),
    (_returns_nan, {}, "reward function _returns_nan returned nan for completion 0"),
    (_returns_inf, {}, "reward function _returns_inf returned inf for completion 1"),
    (_returns_one, {}, "reward function _returns_one returned 1 rewards for 2 completions"),
    (_no_fields, {"answer": ["1", "2"]}, "reward function _no_fields raised TypeError: .*unexpected keyword"),
    (math_reward, {}, "reward function math_reward raised TypeError: .*answer"),  # a data file with no answer column
    (_exits, {}, "reward function _exits raised SystemExit: 0"),  # user code cannot end the command silently
])
def test_call_reward_errors_name_the_function(fn, fields, message):
    with pytest.raises(ValueError, match=message):
        call_reward(fn, ["p", "q"], ["a", "b"], **fields)
    assert call_reward(math_reward, ["p"], ["#### 3"], answer=["3"]) == [1.0]


@pytest.mark.parametrize(
    "spec, error, message",
    [
        ("no_colon_here", ValueError, "not one of"),
        (":fn", ValueError, "not one of"),
        ("bebop.rl.rewards:", ValueError, "not one of"),
        ("bebop_no_such_module_xyz:fn", ImportError, "cannot import reward module"),
        ("bebop.rl.rewards:no_such_fn", ValueError, "has no attribute 'no_such_fn'"),
        ("bebop.rl.rewards:REL_TOL", ValueError, "not a callable"),
        ("/no/such/dir/reward.py:fn", ImportError, "reward file not found"),
    ],
)
def test_load_reward_bad_specs(spec, error, message):
    with pytest.raises(error, match=message):
        load_reward(spec)


def test_load_reward_bad_file_attributes(tmp_path):
    path = _write_module(tmp_path)
    with pytest.raises(ValueError, match="has no attribute 'missing'"):
        load_reward(f"{path}:missing")
    with pytest.raises(ValueError, match="not a callable"):
        load_reward(f"{path}:NOT_CALLABLE")


def test_load_reward_file_that_fails_to_import(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ImportError, match="error importing reward file .*boom"):
        load_reward(f"{path}:fn")


def test_docstring_examples():
    import doctest

    import bebop.rl.rewards

    assert doctest.testmod(bebop.rl.rewards).failed == 0


def test_ctrl_c_inside_a_reward_stays_an_interrupt():
    with pytest.raises(KeyboardInterrupt):
        call_reward(_interrupted, ["p"], ["a"])


def test_resume_reward_runs_only_code_the_command_names(tmp_path, monkeypatch):
    """A run's user-code reward is loaded on resume only when named again (same text, or the same file by
    another path); built-in rewards need no flag."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sub").mkdir()
    assert resume_reward("math", None, "run") == "math" and resume_reward("", None, "run") == ""
    with pytest.raises(ValueError, match="used the reward 'r.py:f', code from outside Bebop .* add --reward r.py:f"):
        resume_reward("r.py:f", None, "run")
    assert resume_reward("r.py:f", "r.py:f", "run") == "r.py:f"
    assert resume_reward("r.py:f", "./sub/../r.py:f", "run") == "r.py:f"  # same file: the run's text is kept
    assert resume_reward("mod:f", "mod:f", "run") == "mod:f"
    for other in ("r.py:g", "sub/r.py:f", "mod:f", "math"):
        with pytest.raises(ValueError, match=f"cannot resume run with --reward {other}: the run used 'r.py:f'"):
            resume_reward("r.py:f", other, "run")
