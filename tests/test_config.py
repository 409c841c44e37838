"""``bebop.config``: defaults < file < flags, unknown keys refused, each field checked once, each as a CLI flag."""

from __future__ import annotations

import dataclasses
import re

import pytest

from bebop.config import (
    SEED,
    field_problems,
    flags_of,
    flatten,
    group,
    integer_in,
    is_auto,
    number_in,
    option,
    parse_speculate_k,
    resolve,
    short_repr,
)
from bebop.mtp.config import CHAIN_CONTEXTS, INITS, TrainMtpConfig
from bebop.utils.errors import BebopError


@dataclasses.dataclass(frozen=True)
class Toy:
    name: str = option("a", "which one", choices=("a", "b"))
    steps: int = option(3, "how many", check=integer_in(1))
    rate: float = option(0.5, "how fast")
    on: bool = option(False, "whether", aliases=("--yes",))


def test_flags_of_reads_type_default_help_and_choices():
    flags = flags_of(Toy)
    assert list(flags) == ["name", "steps", "rate", "on"]
    assert flags["name"][:5] == (str, "a", "which one", ("a", "b"), ())
    assert flags["steps"][:5] == (int, 3, "how many", (), ())
    assert flags["on"].aliases == ("--yes",)
    assert (flags["rate"].type, flags["on"].type) == (float, bool)
    assert list(flags_of(Toy, skip=("steps", "on"))) == ["name", "rate"]


def test_flags_of_refuses_a_field_without_help():
    @dataclasses.dataclass
    class Bare:
        steps: int = 3

    with pytest.raises(AssertionError, match="Bare.steps has no help"):
        flags_of(Bare)


def test_resolve_precedence_and_types(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text("# a comment\nname = 'b'\nsteps = 7\nrate = 1\n")
    assert resolve(Toy, path, {"steps": 9, "on": None}) == Toy(name="b", steps=9, rate=1.0, on=False)
    assert isinstance(resolve(Toy, path).rate, float)  # an integer in a file is a float field's value


@pytest.mark.parametrize("file, overrides, message", [
    ("steps = 'many'\n", {}, "config key 'steps' should be int"),
    ("", {"steps": True}, "config key 'steps' should be int"),
    ("speed = 2\n", {}, "unknown config file keys ['speed']"),
    ("", {"speed": 2}, "unknown flags keys ['speed']"),
])
def test_resolve_refuses_bad_values_in_one_line(tmp_path, file, overrides, message):
    path = tmp_path / "toy.toml"
    path.write_text(file)
    with pytest.raises(BebopError) as info:
        resolve(Toy, path, overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("file, overrides, message", [
    ("steps = 0\n", {}, "steps must be an integer in [1, 2**63 - 1], got 0"),
    ("", {"steps": 10**23}, "steps must be an integer in [1, 2**63 - 1], got 100000000000000000000000"),
    ("name = 'c'\n", {}, "unknown name 'c'; choose one of a, b"),
])
def test_resolve_runs_each_field_s_check_wherever_the_value_comes_from(tmp_path, file, overrides, message):
    path = tmp_path / "toy.toml"
    path.write_text(file)
    with pytest.raises(BebopError) as info:
        resolve(Toy, path, overrides)
    assert str(info.value) == message


def test_field_problems_checks_an_instance_built_directly():
    assert field_problems(Toy()) == [] and field_problems(Toy(steps=-1, name="z")) == [
        "unknown name 'z'; choose one of a, b", "steps must be an integer in [1, 2**63 - 1], got -1"]


def test_integer_and_number_checks_refuse_bools_and_say_the_interval():
    assert integer_in(1)("n", True) == "n must be an integer in [1, 2**63 - 1], got True"
    assert integer_in(0, 4, note=" (CPUs)")("threads", 5) == "threads must be an integer in [0, 4] (CPUs), got 5"
    assert number_in(0, 1, low_open=True)("top_p", 0.0) == "top_p must be a number in (0, 1], got 0.0"
    assert number_in(0, 1)("p", float("nan")).endswith("got nan") and number_in(0, 1)("p", 1) is None


def test_a_shared_setting_is_declared_once():
    """``Setting.field`` gives every command the same help, choices and check; only the default may differ."""
    @dataclasses.dataclass(frozen=True)
    class Two:
        seed: int = SEED.field()
        other_seed: int = SEED.field(default=7)

    flags = flags_of(Two)
    assert flags["seed"].help == flags["other_seed"].help == SEED.help and flags["other_seed"].default == 7
    assert field_problems(Two(seed=-1)) == ["seed must be an integer in [0, 2**63 - 1], got -1"]


def test_a_huge_received_value_is_cut_in_messages():
    bomb = [["lol"] * 9] * 9
    for _ in range(6):
        bomb = [bomb] * 9  # shared references: 9**8 items once expanded, as a YAML alias bomb builds them
    assert len(short_repr(bomb)) < 200 and short_repr(list(range(100))) == "[0, 1, 2, 3, ...]"


def test_parse_speculate_k():
    assert (parse_speculate_k("3"), parse_speculate_k("auto")) == (3, "auto")
    with pytest.raises(ValueError, match="expected an integer or 'auto'"):
        parse_speculate_k("deep")


def test_is_auto_is_mode_auto_or_k_auto_in_a_drafting_mode():
    """The one rule every caller uses (CLI, rl config and loop, rollout runner and backend, engine)."""
    assert is_auto("auto", 3) and is_auto("auto", "auto") and is_auto("rs", "auto") and is_auto("to", "auto")
    assert not is_auto("none", "auto") and not is_auto("rs", 3) and not is_auto("none", 1)


def test_train_mtp_config_is_torch_free_and_its_names_match_the_code():
    """train-mtp's flags come from ``TrainMtpConfig`` without torch; its name lists are the code's."""
    from bebop.mtp.chains import CHAIN_UNROLLS
    from bebop.mtp.train import _check

    assert set(CHAIN_CONTEXTS) == set(CHAIN_UNROLLS)
    flags = flags_of(TrainMtpConfig)
    assert set(flags) == {f.name for f in dataclasses.fields(TrainMtpConfig)}
    assert flags["init"].choices == INITS and flags["chain_context"].choices == CHAIN_CONTEXTS
    for name in INITS:
        _check(TrainMtpConfig(init=name, chain_context=CHAIN_CONTEXTS[0]))
    with pytest.raises(BebopError, match="unknown init 'middle'"):
        _check(TrainMtpConfig(init="middle"))


@dataclasses.dataclass(frozen=True)
class Outer:
    """``Toy`` embedded as a group, with another default for ``steps`` and without ``on``."""

    toy: Toy = group(Toy(steps=5), skip=("on",))
    seed: int = SEED.field()


def test_a_group_s_fields_are_flat_keys_with_the_outer_defaults(tmp_path):
    flags = flags_of(Outer)
    assert list(flags) == ["name", "steps", "rate", "seed"] and flags["steps"].default == 5
    path = tmp_path / "outer.toml"
    path.write_text("name = 'b'\nseed = 4\n")
    cfg = resolve(Outer, path, {"rate": 2})
    assert cfg == Outer(Toy(name="b", steps=5, rate=2.0), seed=4)
    assert flatten(cfg) == {"name": "b", "steps": 5, "rate": 2.0, "seed": 4}
    assert resolve(Outer, None, flatten(cfg)) == cfg  # a saved flat table round-trips


@pytest.mark.parametrize("overrides, message", [
    ({"on": True}, "unknown flags keys ['on']"),  # skipped: not a key of Outer
    ({"toy": {}}, "unknown flags keys ['toy']"),  # a group's name is not a key
    ({"steps": 0}, "steps must be an integer in [1, 2**63 - 1], got 0"),  # a group's field keeps its check
])
def test_a_group_refuses_what_its_fields_refuse(overrides, message):
    with pytest.raises(BebopError, match=re.escape(message)):
        resolve(Outer, None, overrides)


def test_a_key_declared_twice_across_groups_is_refused():
    @dataclasses.dataclass(frozen=True)
    class Twice:
        toy: Toy = group(Toy())
        steps: int = option(3, "how many")

    with pytest.raises(AssertionError, match="config key 'steps' is defined twice"):
        flags_of(Twice)
