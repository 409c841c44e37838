"""Every name the library, the benches and the examples use is defined: pyflakes' undefined-name checks.

A name that is never defined raises NameError only when its line runs, which for a bench's rarely taken
branch can be never in this suite; pyflakes reads the files without running them. Only its undefined-name
messages count here (unused imports and the like are style, not failures).
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHECKED = ("bebop", "bench", "examples")


def undefined_names(paths: list[str]) -> list[str]:
    """pyflakes' undefined-name messages over ``paths`` (files or folders), as 'file:line: message'."""
    api = pytest.importorskip("pyflakes.api")
    from pyflakes import messages

    kinds = (messages.UndefinedName, messages.UndefinedLocal, messages.UndefinedExport)
    found: list[str] = []

    class Collect:
        def unexpectedError(self, filename, msg):  # noqa: N802 (pyflakes' reporter interface)
            found.append(f"{filename}: {msg}")

        def syntaxError(self, filename, msg, lineno, offset, text):  # noqa: N802
            found.append(f"{filename}:{lineno}: {msg}")

        def flake(self, message):
            if isinstance(message, kinds):
                found.append(str(message))

    api.checkRecursive(paths, Collect())
    return found


def test_no_undefined_names():
    assert undefined_names([str(ROOT / name) for name in CHECKED]) == []


def test_an_undefined_name_is_found(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def main():\n    with stage('x'):\n        pass\n")
    assert len(undefined_names([str(bad)])) == 1
