"""examples/trl_grpo.py and the commands around it, run as written: every `python examples/trl_grpo.py` and
`bebop report` command of docs/trainers.md's TRL section, the README's "Your trainer" section and the
example's docstring, with tiny sizes appended (the last flag wins), on a barely-trained embedded model;
then every mode of the example."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
from pathlib import Path

import pytest
import torch

pytest.importorskip("trl")

from bebop.cli import main as bebop_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "trl_grpo.py"
TINY = ["--max-steps", "2", "--prompts-per-step", "2", "--num-generations", "2", "--max-completion-length", "12"]
SOURCES = ((ROOT / "docs" / "trainers.md", "## Use it from TRL"), (ROOT / "README.md", "## Your trainer"))


def load_example():
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


def section(text: str, heading: str) -> str:
    start = text.index(heading + "\n")
    end = text.find("\n## ", start + len(heading))
    return text[start:end if end >= 0 else len(text)]


def documented_commands() -> list[list[str]]:
    """Every command line naming the example or `bebop report` in SOURCES (fenced bash lines and inline code)
    and in the example's docstring, split into words, in order of appearance, each once."""
    texts = [section(path.read_text(), heading) for path, heading in SOURCES] + [load_example().__doc__]
    lines = []
    for text in texts:
        lines += [line for body in re.findall(r"^```bash\n(.*?)^```", text, flags=re.M | re.S)
                  for line in body.splitlines()]
        lines += [span.replace("\n", " ") for span in re.findall(r"(?<!`)`([^`]+)`(?!`)", text)]
        lines += [line.strip() for line in text.splitlines() if line.startswith("    ")]  # the docstring's block
    commands = []
    for line in lines:
        words = shlex.split(line, comments=True)
        named = words[:2] in (["python", "examples/trl_grpo.py"], ["bebop", "report"])
        if named and len(words) > 2 and words not in commands:
            commands.append(words)
    return commands


@pytest.fixture
def in_tmp(cache, tmp_path, monkeypatch):
    """The commands' relative paths (runs/...) land in tmp_path; torch's thread count is put back after."""
    monkeypatch.setenv("BEBOP_CACHE_DIR", str(cache))
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    yield tmp_path
    torch.set_num_threads(threads)


def test_documented_commands_are_found():
    commands = documented_commands()
    runs = [c for c in commands if c[0] == "python"]
    example = load_example()
    assert any("--mode" in c and "none" in c for c in runs)  # the baseline the speed-up needs
    assert any(len(c) == 3 for c in commands if c[1] == "report")  # the report without --out
    assert len({str(vars(example.parse_args(c[2:]))) for c in runs}) == 2  # README's and docs' runs agree


@pytest.mark.slow
def test_documented_commands_run_as_written(in_tmp, capsys):
    """The example's rs run and its baseline, each report form, and the example's closing commands. About 25 s,
    after the module's 20 s cache."""
    example = load_example()
    commands = documented_commands()
    runs = {str(vars(example.parse_args(c[2:]))): c[2:] for c in commands if c[0] == "python"}
    for argv in runs.values():
        assert example.main(argv + TINY).is_dir()
    out = capsys.readouterr().out
    assert "accept length -" in out and re.search(r"accept length [1-4]\.", out)  # none's steps, then rs's
    reports = [c for c in commands if c[0] == "bebop"]
    closing = [shlex.split(line.split("report: ", 1)[1]) for line in out.splitlines() if "report: bebop report" in line]
    assert len(closing) == len(runs)  # the line the example prints at its end, one per run
    for words in reports + [c for c in closing if c not in reports]:
        assert bebop_main(words[1:]) == 0, " ".join(words)
    assert (in_tmp / "runs/trl-none/report/report.md").is_file()
    assert "trl:rs+e2e_tv" in (in_tmp / "runs/trl-grpo/report/report.md").read_text()
    both = (in_tmp / "runs/trl-report/report.md").read_text()
    assert "trl:rs+e2e_tv" in both and "trl:none" in both
    answer = both[both.index("## The answer"):both.index("## The paper's findings")]
    assert "without (trl:none): a speed-up of" in answer and "TRL's `step_time`" in answer
    state = json.loads((in_tmp / "runs/trl-grpo/trainer_state.json").read_text())
    steps = [r for r in state["log_history"] if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(1.0 <= r["spec/accept_length"] <= 4.0 and r["spec/target_entropy"] > 0 for r in steps)
    assert len((in_tmp / "runs/trl-grpo/token_stats.jsonl").read_text().splitlines()) == 2
    none_steps = [r for r in json.loads((in_tmp / "runs/trl-none/trainer_state.json").read_text())["log_history"]
                  if "loss" in r]
    assert all(r["spec/accept_length"] is None and r["spec/rollout_seconds"] > 0 for r in none_steps)


@pytest.mark.slow
@pytest.mark.parametrize("mode", [["--mode", "to"], ["--mode", "auto", "--speculate-k", "auto"]], ids=["to", "auto"])
def test_example_runs_in_every_mode(in_tmp, mode):
    """The modes the documented commands leave out (rs and none run above). A few seconds each, after the
    module's cache."""
    out = load_example().main(["--output-dir", "runs/mode", "--threads", "1", *mode, *TINY])
    steps = [r for r in json.loads((out / "trainer_state.json").read_text())["log_history"] if "loss" in r]
    assert len(steps) == 2 and all(r["spec/rollout_seconds"] > 0 for r in steps)
    record = json.loads((out / "bebop_rollout.json").read_text())
    assert record["mode"] == mode[1] and record["sampling"]["max_new_tokens"] == 12
    if mode[1] == "auto":
        assert all(sum(r[f"auto/mode/{m}"] for m in ("none", "to", "rs")) == 1.0 for r in steps)
        assert all(0 <= r["auto/speculate_k"] <= 4 for r in steps)
