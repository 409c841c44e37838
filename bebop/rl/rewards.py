"""Reward functions: plain callables ``reward(prompts, completions, **fields) -> list[float]``.

Extra dataset fields (``answer``, ...) arrive as keyword lists with one entry per completion,
so a reward for G samples of B prompts sees B*G entries in every list. A reward ignores fields
it does not need through ``**_``.

Answer matching (``extract_final_answer`` / ``answers_match``) is deliberately simple, GSM8K
style. How it deviates from an exact-string or a symbolic (sympy) checker:
  1) The final answer is taken from, in order of preference: the last ``#### x``, the last
     ``\\boxed{...}`` (nested braces allowed), the last "answer is x" / "answer: x", and
     finally the last number anywhere in the text.
  2) Numbers are normalised: thousands commas, ``$``, ``%``, a leading ``+`` and trailing
     zeros after the point are dropped, so "$1,200.00" and "1200" match.
  3) Simple fractions are numbers: ``3/4`` and ``\\frac{3}{4}`` (also ``\\dfrac``, ``\\tfrac``)
     with integer parts compare equal to 0.75. Anything else (``\\sqrt{2}``, ``x+1``) falls
     back to string equality after stripping spaces, ``$`` and ``\\left``/``\\right``; there
     is no symbolic simplification.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

RewardFn = Callable[..., list[float]]

REL_TOL = 1e-6  # relative tolerance of numeric matches: absorbs float formatting, not rounding
ABS_TOL = 1e-9  # absolute tolerance, so that answers of 0 can match

# A number as written in text: optional sign, integer part with or without thousands commas,
# optional decimals, optional "/denominator"; or a bare ".5". The look-behind keeps "x2" and
# "10-3" from yielding "2" / "-3" as signed numbers glued to a word or another number.
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:/\d+)?(?![\d])"
    r"|(?<![\w.])[-+]?\.\d+"
)
_HASHES = re.compile(r"####\s*([^\n]*)")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*[:=]?\s*([^\n]*)", re.IGNORECASE)
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}$")
_BOXED = "\\boxed{"


def _boxed_contents(text: str) -> str | None:
    """Contents of the last ``\\boxed{...}``, matching nested braces; None if absent or open."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, begin = 1, start + len(_BOXED)
    for pos in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[pos], 0)
        if depth == 0:
            return text[begin:pos]
    return None


def _normalize_number(token: str) -> str:
    """Canonical text of a matched number: "+1,200.50" -> "1200.5", "3.00" -> "3", ".5" -> "0.5"."""
    token = token.replace(",", "").lstrip("+")
    if "/" in token:
        return token
    if "." in token:
        token = token.rstrip("0").rstrip(".")
    if token in ("", "-", "-0"):
        return "0"
    return re.sub(r"^(-?)\.", r"\g<1>0.", token)  # ".5" -> "0.5"


def _first_number(text: str) -> str | None:
    """Normalised first number in ``text``, or None."""
    match = _NUMBER.search(text)
    return _normalize_number(match.group(0)) if match else None


def _normalize_text(text: str) -> str:
    """Normalised answer text: number if it is only a number, else stripped LaTeX-ish string."""
    text = text.replace("\u2212", "-").strip()
    text = re.sub(r"\\left|\\right|\\!|\\,|\s+|\$", "", text)
    text = re.sub(r"\\[dt]frac", r"\\frac", text)
    text = text.rstrip(".").removesuffix("\\%").removesuffix("%")
    match = _NUMBER.fullmatch(text)
    return _normalize_number(text) if match else text


def extract_final_answer(text: str) -> str | None:
    """Finds and normalises the final answer of a solution (see the module docstring).

    Example:
        >>> extract_final_answer("so 3 + 4 = 7 apples.\\n#### 7")
        '7'
        >>> extract_final_answer("The total is \\\\boxed{\\\\frac{1}{2}}")
        '\\\\frac{1}{2}'
        >>> extract_final_answer("Costs $1,200.00 in all") is not None
        True

    Args:
        text: a model completion or a reference solution.

    Returns:
        The normalised answer string, or None when the text holds no answer and no number.
    """
    text = text.replace("\u2212", "-")
    hashes = _HASHES.findall(text)
    if hashes:
        tail = hashes[-1].strip()
        number = _first_number(tail)
        if number is not None or tail:
            return number if number is not None else _normalize_text(tail)
    boxed = _boxed_contents(text)
    if boxed is not None and boxed.strip():
        return _normalize_text(boxed)
    stated = _ANSWER_IS.findall(text)
    if stated:
        whole = _normalize_text(stated[-1])  # "$\\frac{1}{2}$." is one answer, not "1"
        if _to_float(whole) is not None:
            return whole
        number = _first_number(stated[-1])
        if number is not None:
            return number
    numbers = _NUMBER.findall(text)
    return _normalize_number(numbers[-1]) if numbers else None


def _to_float(text: str) -> float | None:
    """Value of a normalised answer that is a number, "a/b" or "\\frac{a}{b}"; else None."""
    frac = _FRAC.match(text)
    if frac:
        sign, num, den = frac.groups()
        text = f"{sign}{num}/{den}"
    try:
        if "/" in text:
            num, den = text.split("/")
            value = float(num) / float(den)
        else:
            value = float(text)
    except (ValueError, ZeroDivisionError):
        return None
    return value if math.isfinite(value) else None


def answers_match(predicted: str | None, reference: str | float | int) -> bool:
    """Whether an extracted answer equals the reference answer.

    Numeric when both sides parse as numbers (within ``REL_TOL``/``ABS_TOL``), otherwise
    equality of the normalised strings (case-insensitive).

    Example:
        >>> answers_match("0.75", "3/4"), answers_match("1200", "$1,200"), answers_match(None, "1")
        (True, True, False)

    Args:
        predicted: output of ``extract_final_answer`` (None never matches).
        reference: the dataset's answer (a bare answer, not a full solution).

    Returns:
        True on a match.
    """
    if predicted is None:
        return False
    pred, ref = _normalize_text(str(predicted)), _normalize_text(str(reference))
    pred_value, ref_value = _to_float(pred), _to_float(ref)
    if pred_value is not None and ref_value is not None:
        return math.isclose(pred_value, ref_value, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return pred.lower() == ref.lower()


def math_reward(
    prompts: list[str], completions: list[str], answer: list[str], **_: list
) -> list[float]:
    """1.0 when a completion's final answer matches the reference answer, else 0.0.

    A reference that is a whole GSM8K solution ("... #### 72") is reduced to its final
    answer first, so the raw GSM8K ``answer`` field works as is.

    Args:
        prompts: one prompt per completion (unused).
        completions: the sampled completions.
        answer: one reference answer per completion.

    Returns:
        One reward per completion.
    """
    if len(answer) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(answer)} answers")
    rewards = []
    for completion, reference in zip(completions, answer):
        reference = str(reference)
        if "####" in reference:
            reference = extract_final_answer(reference) or reference
        rewards.append(1.0 if answers_match(extract_final_answer(completion), reference) else 0.0)
    return rewards


REWARDS: dict[str, RewardFn] = {"math": math_reward}  # built-in rewards by short name


def call_reward(reward_fn: RewardFn, prompts: list[str], completions: list[str], **fields: list) -> list[float]:
    """Calls a reward function and checks what it returns: one finite number per completion.

    Raises:
        ValueError: one line naming the function, for an exception inside it (a missing field such as
            ``answer`` included; any BaseException but KeyboardInterrupt, so SystemExit too), a result that
            is not a list of numbers of the right length, or a NaN/infinite reward.

    Example: call_reward(lambda prompts, completions, **_: [1.0] * len(completions), ["p"], ["c"]) -> [1.0].
    """
    name = getattr(reward_fn, "__name__", type(reward_fn).__name__)
    try:
        rewards = reward_fn(prompts, completions, **fields)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - user code's errors (SystemExit too) are reported in one line
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"reward function {name} raised {type(err).__name__}: {first}") from err
    try:
        values = [float(r) for r in rewards]
    except (TypeError, ValueError):
        raise ValueError(f"reward function {name} must return a list of numbers, got "
                         f"{type(rewards).__name__}: {str(rewards)[:80]}") from None
    if len(values) != len(completions):
        raise ValueError(f"reward function {name} returned {len(values)} rewards for {len(completions)} completions")
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"reward function {name} returned {values[bad[0]]} for completion {bad[0]} "
                         f"({len(bad)} non-finite rewards); rewards must be finite numbers")
    return values


def _import_module(module_spec: str):
    """Imports a dotted module name or a ``.py`` file path; raises ImportError with a message."""
    if module_spec.endswith(".py") or "/" in module_spec or "\\" in module_spec:
        path = Path(module_spec).expanduser()
        if not path.is_file():
            raise ImportError(f"reward file not found: {path}")
        name = "_bebop_reward_" + re.sub(r"\W", "_", str(path.resolve()))
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load reward file {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so pickling and dataclasses inside the file work
        try:
            spec.loader.exec_module(module)
        except KeyboardInterrupt:
            raise
        except BaseException as err:  # noqa: BLE001 - SystemExit at import is the user code's error too
            del sys.modules[name]
            raise ImportError(f"error importing reward file {path}: {err}") from err
        return module
    # NOTE: the current directory is importable, as with `python -m` ("my_rewards:score" from its folder).
    added = os.getcwd() not in sys.path and "" not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        return importlib.import_module(module_spec)
    except ImportError as err:
        raise ImportError(f"cannot import reward module {module_spec!r}: {err}") from err
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # noqa: BLE001 - the user's module raised (or exited) while importing
        raise ImportError(f"error importing reward module {module_spec!r}: {type(err).__name__}: {err}") from err
    finally:
        if added:
            sys.path.remove(os.getcwd())


def load_reward(spec: str) -> RewardFn:
    """Resolves a reward function from a short name, ``module:function`` or ``file.py:function``.

    Example:
        >>> load_reward("math") is math_reward
        True
        >>> load_reward("bebop.rl.rewards:math_reward") is math_reward
        True

    Args:
        spec: a key of ``REWARDS``, a dotted module and attribute ``pkg.mod:fn``, or a path
            to a Python file and attribute ``path/to/file.py:fn``.

    Returns:
        The reward callable.

    Raises:
        ValueError: malformed spec, or the attribute is missing or not callable.
        ImportError: the module or file cannot be imported.
    """
    if spec in REWARDS:
        return REWARDS[spec]
    module_spec, sep, attr = spec.rpartition(":")
    if not sep or not module_spec or not attr:
        raise ValueError(
            f"reward spec {spec!r} is not one of {sorted(REWARDS)} nor 'module:function' "
            "nor 'path/to/file.py:function'"
        )
    module = _import_module(module_spec)
    fn = getattr(module, attr, None)
    if fn is None:
        raise ValueError(f"reward module {module_spec!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ValueError(f"reward {spec!r} is a {type(fn).__name__}, not a callable")
    return fn


def _same_reward(spec_a: str, spec_b: str) -> bool:
    """Whether two reward specs name the same function: equal text, or the same file (resolved here) and name."""
    if spec_a == spec_b:
        return True
    (file_a, _, name_a), (file_b, _, name_b) = spec_a.rpartition(":"), spec_b.rpartition(":")
    is_file = all(f.endswith(".py") or "/" in f for f in (file_a, file_b))
    return is_file and name_a == name_b and Path(file_a).expanduser().resolve() == Path(file_b).expanduser().resolve()


def resume_reward(used: str, given: str | None, run: str) -> str:
    """The reward spec a resumed run loads: ``used`` (the run's config.json) when it is built in, else only
    when this command names it again (``given``, its --reward or config file), so a run directory someone
    sends runs no code of its own.

    Example: resume_reward("math", None, "run") -> "math"; resume_reward("r.py:f", "./r.py:f", "run") -> "r.py:f".

    Raises:
        ValueError: one line: the run's reward is user code not named by this command, or another reward.
    """
    if given is None or given == "":
        if used in REWARDS or not used:
            return used
        raise ValueError(f"run {run} used the reward {used!r}, code from outside Bebop that --resume runs only "
                         f"when this command names it: add --reward {used}")
    if not _same_reward(used, given):
        was = repr(used) if used else "the task's own reward"
        raise ValueError(f"cannot resume {run} with --reward {given}: the run used {was} "
                         "(compared by name and path; start a new run with --out to change it)")
    return used  # NOTE: the saved text, so the checkpoint's config check sees the same value
