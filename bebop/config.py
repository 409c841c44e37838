"""Settings: each declared once (help, choices, check), resolved as defaults < a TOML/YAML file < flags.

Every setting a command takes is a field of a small frozen dataclass, declared with ``option``:
its default, help text, choices and check (``Check``: why a value cannot be used, or None). The
CLI makes each field a flag (``flags_of``); ``resolve`` builds a dataclass from its defaults, a
config file and the flags, and runs every field's check, so a value is checked the same way
wherever it comes from. A setting that several commands take is declared once as a ``Setting``.
This module parses no arguments and imports nothing heavy.

A config file is a flat table of the command's settings (its first line, a comment, names the
command that runs it, e.g. ``# bebop rl --config rl.toml``). Unknown keys are an error, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import reprlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

from bebop.utils.errors import BebopError
from bebop.utils.files import check_input_file, read_text

T = TypeVar("T")
AUTO = "auto"  # the value of mode / speculate_k that asks bebop.speculative.auto.chooser to choose
AUTO_MAX_K = 4  # deepest K that speculate_k auto considers
AUTO_EVERY = 10  # auto probes every this many calls (rl steps, or generate calls sharing a profile)
VERIFY_CHOICES = ("token", "block")  # token-wise rejection sampling | block verification (bebop.speculative.block)
ROLLBACK_CHOICES = ("auto", "snapshot", "replay")  # how recurrent layers roll back a verify pass (state_cache)
BACKEND_NAMES = ("engine", "vllm")  # the keys of bebop.rollout.base.BACKENDS, without importing them (--help)
DRAFT_LOSS_NAMES = ("ce", "fkl", "rkl", "tv", "e2e_tv")  # the keys of bebop.losses.DRAFT_LOSSES, without torch (--help)
DEFAULT_DRAFT_LOSS = "e2e_tv"  # the paper's recommended loss: every command's default head
BASELINE_DRAFT_LOSS = "ce"  # the standard MTP objective the paper compares against (and warm-starts from)
INT64_MAX = 2**63 - 1  # counts and seeds become int64 words: rollout noise derives from (seed, step, row)
MIN_TEMPERATURE = 1e-2  # below it logits / T overflow or saturate float32 (vLLM raises such a T to 0.01)

PATH_ROLES = ("input", "output_file", "output_dir")  # what a path setting is to its command: read, or written
Check = Callable[[str, Any], "str | None"]  # (setting name, value) -> why the value cannot be used, or None


def is_auto(mode: str, speculate_k: int | str) -> bool:
    """Whether a (mode, speculate_k) asks ``bebop.speculative.auto`` to choose: mode auto, or K auto in a
    drafting mode (mode none drafts nothing, so it ignores K).

    Example: is_auto("rs", "auto") -> True; is_auto("none", "auto") -> False.
    """
    return mode == AUTO or (speculate_k == AUTO and mode != "none")


# ---------------------------------------------------------------------------------------------- checks
def temperature_problem(temperature: Any, greedy_ok: bool, name: str = "temperature") -> str | None:
    """Why ``temperature`` cannot be used, or None: every temperature Bebop takes is checked here.

    A usable temperature is a finite real number >= MIN_TEMPERATURE, or 0 (greedy decoding) where
    ``greedy_ok``: generation may be greedy; a loss, a log-probability or a sampled rollout needs T > 0.

    Example: temperature_problem(0.0, greedy_ok=True) -> None;
    temperature_problem(0.0, greedy_ok=False) -> "temperature must be a finite number > 0, got 0.0".
    """
    bound = ">= 0 (0 = greedy)" if greedy_ok else "> 0"
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        return f"{name} must be a finite number {bound}, got {short_repr(temperature)}"
    if not math.isfinite(temperature) or temperature < 0 or (temperature == 0 and not greedy_ok):
        return f"{name} must be a finite number {bound}, got {temperature}"
    if 0 < temperature < MIN_TEMPERATURE:
        greedy = "0 (greedy) or " if greedy_ok else ""
        return (f"{name} must be {greedy}at least {MIN_TEMPERATURE:g} (below it logits / T overflow float32), "
                f"got {temperature:g}")
    return None


def speculate_k_problem(speculate_k: Any, auto_ok: bool, name: str = "speculate_k") -> str | None:
    """Why ``speculate_k`` (K) cannot be used, or None: every K a user sets is checked here.

    A usable K is an integer in [1, INT64_MAX] (not a bool), or ``AUTO`` where ``auto_ok`` (the
    rollout's K; a head's training and evaluation need a number).

    Example: speculate_k_problem("auto", auto_ok=True) -> None;
    speculate_k_problem(0, auto_ok=False) -> "speculate_k must be an integer >= 1, got 0".
    """
    if auto_ok and speculate_k == AUTO:
        return None
    if isinstance(speculate_k, bool) or not isinstance(speculate_k, int) or not 1 <= speculate_k <= INT64_MAX:
        allowed = "an integer >= 1 or 'auto'" if auto_ok else "an integer >= 1"
        return f"{name} must be {allowed}, got {short_repr(speculate_k)}"
    return None


def integer_in(low: int, high: int = INT64_MAX, note: str = "") -> Check:
    """The check of an integer setting in [low, high]; ``note`` says why, after the rule.

    Example: integer_in(1)("steps", 0) -> "steps must be an integer in [1, 2**63 - 1], got 0".
    """
    def check(name: str, value: Any) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            upper = "2**63 - 1" if high == INT64_MAX else str(high)
            return f"{name} must be an integer in [{low}, {upper}]{note}, got {short_repr(value)}"
        return None

    return check


def number_in(low: float, high: float, low_open: bool = False, high_open: bool = False, note: str = "") -> Check:
    """The check of a real-number setting in an interval (open or closed at each end).

    Example: number_in(0, 1, low_open=True)("top_p", 0.0) -> "top_p must be a number in (0, 1], got 0.0".
    """
    def check(name: str, value: Any) -> str | None:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and \
            (low < value if low_open else low <= value) and (value < high if high_open else value <= high)
        if not ok:
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
            return f"{name} must be a number in {interval}{note}, got {short_repr(value)}"
        return None

    return check


def check_seed(value: Any, where: str = "seed") -> int:
    """``value`` when it is a seed: an integer in [0, INT64_MAX]; BebopError naming ``where`` otherwise.
    The one check of every seed: --seed flags (``parse_seed``) and config files (``resolve``)."""
    if problem := integer_in(0)(where, value):
        raise BebopError(problem)
    return value


def positive_temperature(name: str, value: Any) -> str | None:
    """``temperature_problem`` where greedy decoding is not allowed (losses, log-probabilities, RL rollouts)."""
    return temperature_problem(value, greedy_ok=False, name=name)


def fixed_speculate_k(name: str, value: Any) -> str | None:
    """``speculate_k_problem`` where K must be a number (a head's training and evaluation)."""
    return speculate_k_problem(value, auto_ok=False, name=name)


# ---------------------------------------------------------------------------------------------- parsers
def parse_speculate_k(text: str) -> int | str:
    """A ``--speculate-k`` value: an integer, or ``auto``; ValueError otherwise.

    Example: parse_speculate_k("3") -> 3; parse_speculate_k("auto") -> "auto".
    """
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected an integer or 'auto', got {text!r}") from None


def parse_seed(text: str) -> int:
    """A ``--seed`` value (``check_seed``); ValueError otherwise.

    Example: parse_seed("7") -> 7; parse_seed(str(2**64)) is refused.
    """
    try:
        return check_seed(int(text))
    except (ValueError, BebopError):
        raise ValueError(f"must be an integer in [0, 2**63 - 1], got {text!r}") from None


def short_repr(value: Any) -> str:
    """``repr`` cut to a line: a received value may be huge (a YAML alias bomb expands to billions of items).

    Example: short_repr(list(range(100))) -> "[0, 1, 2, 3, ...]".
    """
    return _SHORT.repr(value)


_SHORT = reprlib.Repr()  # NOTE: attributes, not keywords: Python 3.11's Repr takes none
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 2, 4, 4, 4
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 80, 80, 40


# ---------------------------------------------------------------------------------------------- declarations
def option(default: Any, help: str, choices: tuple[str, ...] = (), aliases: tuple[str, ...] = (), *,
           check: Check | None = None, parse: Callable[[str], Any] | None = None, required: bool = False,
           metavar: str | None = None, role: str | None = None) -> Any:
    """A config field with its help text and, where it has them, the names it takes (``choices``),
    other spellings of its flag (``aliases``), its check, how its flag's text is read (``parse``;
    default: the default's type), whether a command needs it (``required``, default None), and the
    ``role`` of a path (one of ``PATH_ROLES``). The CLI makes each such field a flag (``flags_of``),
    as HF's ``TrainingArguments`` does."""
    if role not in (None, *PATH_ROLES):
        raise AssertionError(f"role {role!r} is not one of {PATH_ROLES}")
    return dataclasses.field(default=default, metadata={
        "help": help, "choices": tuple(choices), "aliases": tuple(aliases), "check": check, "parse": parse,
        "required": required, "metavar": metavar, "role": role})


class Setting(NamedTuple):
    """A setting several commands take, declared once: ``field()`` makes it a dataclass field."""

    default: Any
    help: str
    choices: tuple[str, ...] = ()
    check: Check | None = None
    parse: Callable[[str], Any] | None = None
    role: str | None = None  # a path's role (PATH_ROLES)

    def field(self, default: Any = dataclasses.MISSING, required: bool = False) -> Any:
        """This setting as an ``option`` field, with another default where a command has its own."""
        return option(self.default if default is dataclasses.MISSING else default, self.help, self.choices,
                      check=self.check, parse=self.parse, required=required, role=self.role)


class Flag(NamedTuple):
    """A config field as a command-line flag (``flags_of``)."""

    type: Callable[[str], Any]  # parses the flag's text (the default's type, or the field's parse)
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # other spellings of the flag, e.g. "--async"
    required: bool = False  # the command needs a value (from the flag or the config file)
    metavar: str | None = None
    role: str | None = None  # a path's role (PATH_ROLES), None for other settings


def _value_type(f: dataclasses.Field) -> type | None:
    """The type a field's values have, when one Python type says it (None: its check decides)."""
    parse = f.metadata.get("parse")
    if parse is not None:
        return parse if isinstance(parse, type) else None
    if isinstance(f.default, tuple):
        return tuple
    return None if f.default is None else type(f.default)


def flags_of(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Flag]:
    """Each field of the flat config dataclass ``cls`` (but ``skip``) as a flag, in declaration order;
    every field must carry its help (``option``).

    Example:
        >>> from bebop.mtp.config import TrainMtpConfig
        >>> flags_of(TrainMtpConfig)["steps"][:2]
        (<class 'int'>, 300)
    """
    out = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if "help" not in f.metadata:
            raise AssertionError(f"{cls.__name__}.{f.name} has no help text (declare it with option)")
        parse = f.metadata.get("parse") or (str if isinstance(f.default, tuple) else type(f.default))
        out[f.name] = Flag(parse, f.default, f.metadata["help"], f.metadata.get("choices", ()),
                           f.metadata.get("aliases", ()), f.metadata.get("required", False),
                           f.metadata.get("metavar"), f.metadata.get("role"))
    return out


def field_problems(config: Any) -> list[str]:
    """Why each field of the dataclass instance ``config`` cannot be used (its choices and ``check``), in order.

    Example: field_problems(TrainMtpConfig(log_every=0)) -> ["log_every must be an integer in [1, 2**63 - 1], got 0"].
    """
    problems = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if f.metadata.get("required") and value is None:
            problems.append(f"--{f.name.replace('_', '-')} is required")
            continue
        choices = f.metadata.get("choices", ())
        if choices and value not in choices:
            problems.append(f"unknown {f.name.replace('_', ' ')} {short_repr(value)}; choose one of {', '.join(choices)}")
        elif value is not None and (check := f.metadata.get("check")) is not None and (problem := check(f.name, value)):
            problems.append(problem)
    return problems


# ---------------------------------------------------------------------------------------------- files and resolution
def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a ``.toml``, ``.yaml`` or ``.yml`` file into a dict (one clear error line on failure)."""
    path = check_input_file(path, "config file")
    text = read_text(path, "config file")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.load(text, Loader=_unique_keys_loader()) or {}
        else:
            raise BebopError(f"config file {path} must end in .toml, .yaml or .yml")
    except BebopError:
        raise
    except Exception as e:  # noqa: BLE001 - any parser error (nesting too deep included) is a bad file
        raise BebopError(f"cannot parse config file {path}: {(str(e) or type(e).__name__).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise BebopError(f"config file {path} must hold a table of settings")
    return data


def _unique_keys_loader():
    """PyYAML's safe loader, refusing a key given twice in one mapping (YAML forbids it; PyYAML keeps the
    last silently, so a setting typed twice would be half-ignored). TOML's parser refuses it itself."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if not isinstance(key, (str, int, float, bool)):
                    continue
                if key in seen:
                    line = key_node.start_mark.line + 1
                    raise ValueError(f"key {short_repr(key)} is given twice (again on line {line})")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return UniqueKeyLoader


def merge_sources(
    file: str | os.PathLike | None, overrides: dict[str, Any] | None, valid_keys: list[str]
) -> dict[str, Any]:
    """The file's table updated by the non-None overrides; unknown keys in either are an error."""
    values: dict[str, Any] = {}
    for source, data in (("config file", load_config_file(file) if file else {}), ("flags", overrides or {})):
        unknown = sorted(str(k) for k in set(data) - set(valid_keys))
        if unknown:
            raise BebopError(f"unknown {source} keys {short_repr(unknown)}; valid keys: {', '.join(valid_keys)}")
        values.update({k: v for k, v in data.items() if v is not None})
    return values


def _typed(f: dataclasses.Field, value: Any) -> Any:
    """``value`` as field ``f`` holds it (a list as a tuple, an int as a float); BebopError when it has another type."""
    expected = _value_type(f)
    if expected is tuple and isinstance(value, (list, tuple)):
        if any(not isinstance(v, str) for v in value):
            raise BebopError(f"config key {f.name!r} should be a list of strings, got {short_repr(value)}")
        return tuple(value)
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is not None and (isinstance(value, bool) != (expected is bool) or not isinstance(value, expected)):
        raise BebopError(f"config key {f.name!r} should be {expected.__name__}, got {short_repr(value)}")
    return value


def resolve(cls: type[T], file: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> T:
    """Builds ``cls`` from its defaults, then ``file``, then ``overrides`` (None values are skipped), and
    runs every field's check (``field_problems``); BebopError (one line naming every problem) otherwise."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = {name: _typed(fields[name], value) for name, value in merge_sources(file, overrides, list(fields)).items()}
    config = cls(**values)
    if problems := field_problems(config):
        raise BebopError("; ".join(problems))
    return config


# ---------------------------------------------------------------------------------------------- shared settings
MODES = ("none", "to", "rs")  # plain | target-only | rejection sampling (bebop.speculative)
MODE = Setting("rs", "decoding: none (plain) | to (target-only) | rs (rejection sampling) | auto (the fastest "
               "predicted after short probes)", choices=(*MODES, AUTO))
SPECULATE_K = Setting(3, f"K, drafts verified per target forward, or auto (1-{AUTO_MAX_K}, the fastest predicted)",
                      check=lambda name, value: speculate_k_problem(value, auto_ok=True, name=name),
                      parse=parse_speculate_k)
VERIFY = Setting("token", "how mode rs verifies a drafted chain: token (token-wise) | block (jointly, Sun et al. "
                 "2024: exact, never fewer accepted drafts in expectation; engine backend only)", choices=VERIFY_CHOICES)
RECURRENT_ROLLBACK = Setting("auto", "how a hybrid's recurrent layers roll back a verify pass: snapshot (keep the "
                             "state after every position) | replay (keep their inputs, rerun the kept ones: less "
                             "memory) | auto (replay when the snapshots would be large); exact either way",
                             choices=ROLLBACK_CHOICES)
BACKEND = Setting("engine", "rollout engine: engine (Bebop's: exact, seeded, per-token stats) | vllm (the vllm "
                  "extra; check-lossless judges it against vLLM's own plain sampling and Bebop's)", choices=BACKEND_NAMES)
TOP_K = Setting(0, "top-k filter of the target's distribution; 0 = off", check=integer_in(0))
TOP_P = Setting(1.0, "top-p (nucleus) filter of the target's distribution; 1 = off",
                check=number_in(0, 1, low_open=True))
MAX_NEW_TOKENS = Setting(64, "completion length limit, EOS included", check=integer_in(1))
TOKENIZER = Setting(None, "tokenizer directory, when the model's own has no tokenizer files (default: --model's)",
                    parse=str, role="input")
SEED = Setting(0, "seed of everything the command draws (data, init, sampling): the same seed, the same result",
               check=integer_in(0), parse=parse_seed)
