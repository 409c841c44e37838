"""The documentation's fenced blocks, and how the tests that run them read shell commands.

A block is found by a fence line (three backticks and a language) in one of ``DOC_FILES``. A
shell block's commands are its lines with ``\\``-continued lines joined and comments dropped;
``NAME=value`` lines set variables that later commands read as ``$NAME``.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC_FILES = (REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "bench" / "README.md")
SETTING = re.compile(r"^([A-Z_][A-Z0-9_]*)=(\S+)$")  # NAME=value, one token
VARIABLE = re.compile(r"\$(?:\{([A-Z_][A-Z0-9_]*)\}|([A-Z_][A-Z0-9_]*))")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.M | re.S)


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced block of a documentation file."""

    path: str  # the file, relative to the repository root
    line: int  # line number of the opening fence
    language: str  # the fence's language ("" when it names none)
    body: str  # the text between the fences

    @property
    def first_line(self) -> str:
        """The block's first non-blank line, stripped: how the tests' lists name it."""
        return next((line.strip() for line in self.body.splitlines() if line.strip()), "")


def fenced_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path``, in order."""
    text = path.read_text()
    return [Block(str(path.relative_to(REPO)), text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
            for m in FENCE.finditer(text)]


def section_blocks(text: str, heading: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced block between ``heading`` and the next level-2 heading."""
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    body = text[start:end if end >= 0 else len(text)]
    return re.findall(r"^```(\w+)\n(.*?)^```", body, flags=re.M | re.S)


def command_lines(body: str) -> list[str]:
    """A bash block's command lines, stripped; ``\\``-continued lines joined, blank and comment lines dropped."""
    joined = re.sub(r"\\\n", " ", body)
    return [line.strip() for line in joined.splitlines() if shlex.split(line, comments=True)]


def shell_commands(body: str) -> list[list[str]]:
    """A bash block's commands, each split into words (``command_lines``, inline comments dropped)."""
    return [shlex.split(line, comments=True) for line in command_lines(body)]


def expand(word: str, settings: dict[str, str]) -> str:
    """``word`` with each ``$NAME`` / ``${NAME}`` replaced by its setting; an unset name fails the test."""
    def value(match: re.Match) -> str:
        name = match.group(1) or match.group(2)
        assert name in settings, f"the docs use ${name}, which no settings block sets"
        return settings[name]

    return VARIABLE.sub(value, word)
