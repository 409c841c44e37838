"""The README's "Your own model and data" walkthrough, run as written on a tiny random model.

Every fenced block of that section runs in order: ``bash`` blocks line by line (``NAME=value``
settings, then ``bebop ...`` commands through ``bebop.cli.main``, in this process), and a ``python``
block whose first line is ``# FILE.py`` is written to FILE.py. The README's settings block sets the
sizes; this test replaces each value with a tiny one from ``TINY`` (and fails when the README sets
a name ``TINY`` does not size), so the walkthrough cannot drift from the CLI. The files a user
brings (the model directory and three JSONL files) are made here. Then the section "The library
in three lines" runs on the head the walkthrough trained.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from bebop.cli import main
from tests.helpers.cli import save_model_dir
from tests.helpers.doc_blocks import REPO, SETTING, expand, section_blocks, shell_commands
from tests.helpers.models import WORDS, tiny_model

README = REPO / "README.md"
WALKTHROUGH = "## Your own model and data"
LIBRARY = "## The library in three lines"
TINY = {"MODEL": "./my-model", "NEW_TOKENS": "16", "HEAD_STEPS": "4", "RL_STEPS": "2", "SAMPLES": "200"}


def run_block(language: str, body: str, settings: dict[str, str]) -> None:
    """Runs one README block in the current directory (see the module docstring)."""
    if language == "python":
        first = body.splitlines()[0]
        assert first.startswith("# ") and first.endswith(".py"), f"a python block names its file: {first!r}"
        Path(first[2:]).write_text(body)
        return
    assert language == "bash", f"unexpected block language {language!r}"
    for words in shell_commands(body):
        if len(words) == 1 and (setting := SETTING.match(words[0])):
            name = setting.group(1)
            assert name in TINY, f"README sets {name}; give it a tiny value in tests/test_readme.py TINY"
            settings[name] = TINY[name]
            continue
        words = [expand(w, settings) for w in words]
        assert words[0] == "bebop", f"the walkthrough runs bebop commands only: {' '.join(words)}"
        assert main(words[1:]) == 0, f"README command failed: {' '.join(words)}"


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


@pytest.fixture
def user_files(tmp_path, monkeypatch):
    """What the walkthrough says a user brings: a model directory and three JSONL files."""
    save_model_dir(tmp_path / TINY["MODEL"], tiny_model("qwen3", vocab_size=16))
    rng = random.Random(0)

    def prompt() -> str:
        return " ".join(rng.choice(WORDS) for _ in range(4))

    _jsonl(tmp_path / "prompts.jsonl", [{"prompt": prompt()} for _ in range(12)])
    _jsonl(tmp_path / "heldout-prompts.jsonl", [{"prompt": prompt()} for _ in range(6)])
    _jsonl(tmp_path / "train.jsonl", [{"prompt": prompt(), "answer": rng.choice(WORDS)} for _ in range(16)])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_blocks_are_found():
    text = README.read_text()
    blocks = section_blocks(text, WALKTHROUGH)
    assert [lang for lang, _ in blocks].count("python") == 1 and len(blocks) >= 6
    commands = [w for lang, body in blocks if lang == "bash" for w in shell_commands(body)]
    runs = [c for c in commands if c[:2] == ["bebop", "rl"]]
    assert any(c[:2] == ["bebop", "report"] for c in commands) and any("none" in c for c in runs)  # report's baseline
    assert shell_commands("a \\\n  b  # c\n# d\n\ne") == [["a", "b"], ["e"]]


@pytest.mark.slow
def test_walkthrough_runs_as_written(user_files):
    text = README.read_text()
    settings: dict[str, str] = {}
    for language, body in section_blocks(text, WALKTHROUGH):
        run_block(language, body, settings)
    assert settings.keys() == TINY.keys()  # every tiny size was used by the README
    report = (user_files / "report" / "report.md").read_text()
    # What the README says report.md opens with: step times, their ratio, the rollout's share, accept length
    # against entropy with its figure; then the findings these two runs answer (the step speed-up alone).
    answer = report[report.index("## The answer"):report.index("## The paper's findings")]
    for needle in ("**An RL step took", "without (none): a speed-up of", "the rollout was", "of the step",
                   "Accept length was", "the policy's entropy went", "(accept_vs_entropy.png)"):
        assert needle in answer, needle
    findings = report[report.index("## The paper's findings"):report.index("## Details")]
    assert [line[:5] for line in findings.splitlines() if line[:2] == "| " and line[2].isdigit()] == ["| 7 |"]
    stats = json.loads((user_files / "stats.json").read_text())
    assert stats["spec/num_drafts"] > 0
    for run in ("none", "rs"):
        rows = (user_files / "runs" / run / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == int(TINY["RL_STEPS"])
    [(language, code)] = section_blocks(text, LIBRARY)
    assert language == "python"
    scope: dict = {}
    exec(compile(code, "README.md", "exec"), scope)  # noqa: S102 (the README's own example)
    assert len(scope["out"].texts) == 1
