"""Each rollout setting is declared once (``bebop.speculative.settings``) and reaches every command that
embeds its group: the field's default, the flag, the config-file key and the check are the declaration's."""

from __future__ import annotations

import dataclasses

import pytest

from bebop.config import flags_of, resolve
from bebop.options import GenerateOptions
from bebop.rl.config import RLConfig, config_fields
from bebop.speculative import settings
from bebop.speculative.settings import ROLLOUT_SPEC, SamplingParams, SpecConfig, settings_problems
from bebop.utils.errors import BebopError
from tests.helpers.doc_blocks import REPO, fenced_blocks

GROUPS = (SamplingParams, SpecConfig)


def _declaration(field: dataclasses.Field) -> settings.Setting:
    """The ``Setting`` of ``bebop.speculative.settings`` whose help the field carries (exactly one)."""
    (found,) = [s for s in vars(settings).values() if isinstance(s, settings.Setting)
                and s.help == field.metadata["help"]]
    return found


@pytest.mark.parametrize("cls", GROUPS)
def test_every_field_is_a_declaration_with_its_default(cls):
    for f in dataclasses.fields(cls):
        setting = _declaration(f)
        assert f.default == setting.default and f.metadata["check"] is setting.check, f.name
        assert f.metadata["choices"] == setting.choices, f.name


@pytest.mark.parametrize("command, flags, holder", [
    ("generate", lambda: flags_of(GenerateOptions), GenerateOptions),
    ("rl", config_fields, RLConfig),
])
def test_every_command_takes_every_setting_of_its_groups_but_its_skip(command, flags, holder):
    """A field added to SamplingParams or SpecConfig is a flag of generate and rl with nothing else written."""
    taken = flags()
    for f in dataclasses.fields(holder):
        if "group" not in f.metadata or type(f.default) not in GROUPS:
            continue
        for inner in dataclasses.fields(f.default):
            if inner.name in f.metadata["group"]:
                assert inner.name not in taken, (command, inner.name)
            else:
                assert taken[inner.name].help == inner.metadata["help"], (command, inner.name)
                assert taken[inner.name].default == getattr(f.default, inner.name), (command, inner.name)


def test_the_commands_roll_out_rs_and_the_library_decodes_plainly():
    assert SpecConfig().mode == "none" and ROLLOUT_SPEC.mode == "rs"
    assert flags_of(GenerateOptions)["mode"].default == config_fields()["mode"].default == "rs"
    assert config_fields()["max_new_tokens"].default == 48 != flags_of(GenerateOptions)["max_new_tokens"].default


def test_a_value_is_refused_the_same_way_at_resolve_and_at_the_engine_s_door():
    """The stop-string rule is the declaration's: the CLI's resolve and ``settings_problems`` say the same."""
    with pytest.raises(BebopError) as info:
        resolve(GenerateOptions, None, {"stop": ("",), "out": "o.jsonl"})
    assert str(info.value) == settings_problems(None, SamplingParams(stop=("",)))[0] == \
        "stop strings must be non-empty, got ['']"


def test_layout_worked_example_runs_as_written(capsys):
    """docs/layout.md's example of adding a setting (a min-p filter) runs, and prints the refusal it shows."""
    (block,) = [b for b in fenced_blocks(REPO / "docs" / "layout.md") if b.language == "python"]
    exec(compile(block.body, "docs/layout.md", "exec"), {"__name__": __name__})  # noqa: S102 (a module in sys.modules)
    assert capsys.readouterr().out.strip() == "min_p must be a number in [0, 1], got 2.0"
