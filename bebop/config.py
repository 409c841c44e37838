"""Config resolution: dataclass defaults < a TOML/YAML file < command-line flags.

A config file is a flat table of the dataclass's fields (its first line, a comment, names the
command that runs it, e.g. ``# bebop rl --config rl.toml``). Unknown keys are an error, so a typo
never silently falls back to a default.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
from pathlib import Path
from typing import Any, Callable, NamedTuple, TypeVar

from bebop.utils.io import BebopError, read_text

T = TypeVar("T")
AUTO = "auto"  # the value of mode / speculate_k that asks bebop.speculative.auto.chooser to choose
AUTO_MAX_K = 4  # deepest K that speculate_k auto considers
AUTO_EVERY = 10  # auto probes every this many calls (rl steps, or generate calls sharing a profile)
VERIFY_CHOICES = ("token", "block")  # token-wise rejection sampling | block verification (bebop.speculative.block)


def is_auto(mode: str, speculate_k: int | str) -> bool:
    """Whether a (mode, speculate_k) asks ``bebop.speculative.auto`` to choose: mode auto, or K auto in a
    drafting mode (mode none drafts nothing, so it ignores K).

    Example: is_auto("rs", "auto") -> True; is_auto("none", "auto") -> False.
    """
    return mode == AUTO or (speculate_k == AUTO and mode != "none")


DRAFT_LOSS_NAMES = ("ce", "fkl", "rkl", "tv", "e2e_tv")  # the keys of bebop.losses.DRAFT_LOSSES, without torch (--help)
DEFAULT_DRAFT_LOSS = "e2e_tv"  # the paper's recommended loss: every command's default head
BASELINE_DRAFT_LOSS = "ce"  # the standard MTP objective the paper compares against (and warm-starts from)


def speculate_k_value(text: str) -> int | str:
    """A ``--speculate-k`` value: an integer, or ``auto``.

    Example: speculate_k_value("3") -> 3; speculate_k_value("auto") -> "auto".
    """
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer or 'auto', got {text!r}") from None


SEED_MAX = 2**63 - 1  # seeds become int64 words (bebop.speculative.rng) and torch seeds


def check_seed(value: Any, where: str = "seed") -> int:
    """``value`` when it is a seed: an integer in [0, SEED_MAX]; BebopError naming ``where`` otherwise.
    The one check of every seed: --seed flags (``seed_value``) and config files (``resolve``)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= SEED_MAX:
        raise BebopError(f"{where} must be an integer in [0, 2**63 - 1], got {value!r}")
    return value


def seed_value(text: str) -> int:
    """A ``--seed`` value (``check_seed``).

    Example: seed_value("7") -> 7; seed_value(str(2**64)) is refused.
    """
    try:
        return check_seed(int(text))
    except (ValueError, BebopError):
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**63 - 1], got {text!r}") from None
def temperature_problem(temperature: Any, greedy_ok: bool) -> str | None:
    """Why ``temperature`` cannot be used, or None: every temperature Bebop takes is checked here.

    A usable temperature is a finite real number > 0, or 0 (greedy decoding) where ``greedy_ok``:
    generation may be greedy; a loss, a log-probability or a sampled rollout needs T > 0.

    Example: temperature_problem(0.0, greedy_ok=True) -> None;
    temperature_problem(0.0, greedy_ok=False) -> "temperature must be a finite number > 0, got 0.0".
    """
    bound = ">= 0 (0 = greedy)" if greedy_ok else "> 0"
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)):
        return f"temperature must be a finite number {bound}, got {temperature!r}"
    if not math.isfinite(temperature) or temperature < 0 or (temperature == 0 and not greedy_ok):
        return f"temperature must be a finite number {bound}, got {temperature}"
    return None


def speculate_k_problem(speculate_k: Any, auto_ok: bool) -> str | None:
    """Why ``speculate_k`` (K) cannot be used, or None: every K a user sets is checked here.

    A usable K is an integer >= 1 (not a bool), or ``AUTO`` where ``auto_ok`` (the rollout's K;
    a head's training and evaluation need a number).

    Example: speculate_k_problem("auto", auto_ok=True) -> None;
    speculate_k_problem(0, auto_ok=False) -> "speculate_k must be an integer >= 1, got 0".
    """
    if auto_ok and speculate_k == AUTO:
        return None
    if isinstance(speculate_k, bool) or not isinstance(speculate_k, int) or speculate_k < 1:
        allowed = "an integer >= 1 or 'auto'" if auto_ok else "an integer >= 1"
        return f"speculate_k must be {allowed}, got {speculate_k!r}"
    return None


def option(default: Any, help: str, choices: tuple[str, ...] = (), aliases: tuple[str, ...] = ()) -> Any:
    """A config field with its help text, when it takes one of a few names those names, and other
    spellings of its flag: the CLI makes each such field a flag (``flags_of``), as HF's
    ``TrainingArguments`` does."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": tuple(choices),
                                                        "aliases": tuple(aliases)})


class Flag(NamedTuple):
    """A config field as a command-line flag (``flags_of``)."""

    type: Callable[[str], Any]  # parses the flag's text (the default's type)
    default: Any
    help: str
    choices: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()  # other spellings of the flag, e.g. "--async"


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
        parse = seed_value if f.name == "seed" else type(f.default)  # NOTE: every seed is checked by check_seed
        out[f.name] = Flag(parse, f.default, f.metadata["help"], f.metadata.get("choices", ()),
                           f.metadata.get("aliases", ()))
    return out


def load_config_file(path: str | os.PathLike) -> dict[str, Any]:
    """Reads a ``.toml``, ``.yaml`` or ``.yml`` file into a dict (one clear error line on failure)."""
    path = Path(path)
    if not path.is_file():
        raise BebopError(f"config file not found: {path}")
    text = read_text(path, "config file")
    try:
        if path.suffix == ".toml":
            import tomllib

            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise BebopError(f"config file {path} must end in .toml, .yaml or .yml")
    except BebopError:
        raise
    except Exception as e:  # noqa: BLE001 - any parser error is a bad file
        raise BebopError(f"cannot parse config file {path}: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise BebopError(f"config file {path} must hold a table of settings")
    return data


def merge_sources(
    file: str | os.PathLike | None, overrides: dict[str, Any] | None, valid_keys: list[str]
) -> dict[str, Any]:
    """The file's table updated by the non-None overrides; unknown keys in either are an error."""
    values: dict[str, Any] = {}
    for source, data in (("config file", load_config_file(file) if file else {}), ("flags", overrides or {})):
        unknown = sorted(set(data) - set(valid_keys))
        if unknown:
            raise BebopError(f"unknown {source} keys {unknown}; valid keys: {', '.join(valid_keys)}")
        values.update({k: v for k, v in data.items() if v is not None})
    return values


def resolve(cls: type[T], file: str | os.PathLike | None = None, overrides: dict[str, Any] | None = None) -> T:
    """Builds ``cls`` from its defaults, then ``file``, then ``overrides`` (None values are skipped)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values = merge_sources(file, overrides, list(fields))
    for name, value in values.items():
        default = fields[name].default
        if isinstance(default, tuple) and isinstance(value, list):
            values[name] = tuple(value)
        elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
            values[name] = float(value)
        elif isinstance(value, bool) and not isinstance(default, bool):  # True is an int to Python, not to a user
            raise BebopError(f"config key {name!r} should be {type(default).__name__}, got {value!r}")
        elif default is not None and default is not dataclasses.MISSING and not isinstance(value, type(default)):
            raise BebopError(f"config key {name!r} should be {type(default).__name__}, got {value!r}")
        if name == "seed":
            check_seed(value, "config key 'seed'")
    return cls(**values)
