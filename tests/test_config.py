"""``bebop.config``: defaults < file < flags, unknown keys refused, and each config field as a CLI flag."""

from __future__ import annotations

import dataclasses

import pytest

from bebop.config import flags_of, is_auto, option, resolve, speculate_k_value
from bebop.mtp.config import CHAIN_CONTEXTS, INITS, TrainMtpConfig
from bebop.utils.io import BebopError


@dataclasses.dataclass(frozen=True)
class Toy:
    name: str = option("a", "which one", choices=("a", "b"))
    steps: int = option(3, "how many")
    rate: float = option(0.5, "how fast")
    on: bool = option(False, "whether", aliases=("--yes",))


def test_flags_of_reads_type_default_help_and_choices():
    flags = flags_of(Toy)
    assert list(flags) == ["name", "steps", "rate", "on"]
    assert flags["name"] == (str, "a", "which one", ("a", "b"), ())
    assert flags["steps"] == (int, 3, "how many", (), ())
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


def test_speculate_k_value():
    assert (speculate_k_value("3"), speculate_k_value("auto")) == (3, "auto")
    with pytest.raises(Exception, match="expected an integer or 'auto'"):
        speculate_k_value("deep")


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
