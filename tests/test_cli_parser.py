"""The ``bebop`` parser: no abbreviated flags, and a flag a subcommand does not know refused with that
subcommand's usage."""

from __future__ import annotations

import argparse

import pytest

from bebop.cli import COMMANDS, build_parser, main


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return [parser, *(p for s in subs for p in s.choices.values())]


def test_no_parser_takes_abbreviations():
    parsers = _parsers(build_parser())
    assert len(parsers) == len(COMMANDS) + 1
    assert not [p.prog for p in parsers if p.allow_abbrev]


@pytest.mark.parametrize("argv, prog, flag", [
    (["generate", "--max-new-tok", "8"], "bebop generate", "--max-new-tok"),  # a prefix of --max-new-tokens
    (["rl", "--stpes", "3"], "bebop rl", "--stpes"),
    (["report", "run", "--ou", "x"], "bebop report", "--ou"),
])
def test_unknown_flag_is_refused_with_the_subcommands_usage(argv, prog, flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith(f"usage: {prog} ") and f"{prog}: error: unrecognized arguments: {flag}" in err


def test_every_script_parser_refuses_abbreviations():
    """The bench scripts and the example take no abbreviated flag either (``allow_abbrev=False``)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    scripts = sorted([*(root / "bench").glob("*.py"), *(root / "examples").glob("*.py")])
    calls = [(path.name, call) for path in scripts
             for call in re.findall(r"(?:ArgumentParser|add_parser)\((?:[^()]|\([^()]*\))*\)", path.read_text())]
    assert len(calls) >= 12
    assert not [c for c in calls if "allow_abbrev=False" not in c[1]]
