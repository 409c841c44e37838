"""Where commands write: every output file against every input and every other output, and lock files
that are never written through a link planted at their path. Each refusal is one line, exit 2, with
every input byte for byte as it was and nothing created."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bebop.cli import main
from tests.helpers.cli import model_workdir


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = model_workdir(tmp_path_factory.mktemp("output-paths"))
    (root / "data.jsonl").write_text(json.dumps({"token_ids": [1, 4, 5, 6, 7, 8, 9, 10], "start": 2}) + "\n")
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


GEN = ["generate", "--model", "model", "--mtp", "head", "--prompts", "prompts.jsonl", "--max-new-tokens", "2"]
EVAL = ["eval-mtp", "--model", "model", "--mtp", "head", "--data", "data.jsonl", "--speculate-k", "2"]
SAME_PATH = {  # case -> argv, the error line it must give
    "eval-mtp --json is --data": ([*EVAL, "--json", "data.jsonl"],
                                  "--json file data.jsonl is the --data input data.jsonl: the command would write "
                                  "over it"),
    "generate --out is --prompts": ([*GEN, "--out", "prompts.jsonl"], "--out file prompts.jsonl is the --prompts input"),
    "generate --stats-json is --prompts": ([*GEN, "--out", "o.jsonl", "--stats-json", "./prompts.jsonl"],
                                           "--stats-json file prompts.jsonl is the --prompts input prompts.jsonl"),
    "generate --stats-json is --out": ([*GEN, "--out", "o.jsonl", "--stats-json", "o.jsonl"],
                                       "--out file o.jsonl is the --stats-json file o.jsonl"),
    "generate --out is the head's weights": ([*GEN, "--out", "head/model.safetensors"],
                                             "--out file head/model.safetensors lies inside the --mtp input head"),
    "generate --out is a hard link to --prompts": ([*GEN, "--out", "prompts-link.jsonl"],
                                                   "--out file prompts-link.jsonl is the --prompts input"),
    "generate --out is its --config file": ([*GEN, "--config", "gen.toml", "--out", "gen.toml"],
                                            "--out file gen.toml is the --config input gen.toml"),
}


@pytest.mark.parametrize("case", list(SAME_PATH))
def test_an_output_file_that_is_an_input_or_another_output_is_refused(case, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    (workdir / "gen.toml").write_text("# bebop generate --config gen.toml\nmode = 'rs'\n")
    if not (workdir / "prompts-link.jsonl").exists():
        os.link(workdir / "prompts.jsonl", workdir / "prompts-link.jsonl")
    argv, message = SAME_PATH[case]
    before = snapshot(workdir)
    assert main([*argv, "--threads", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"bebop: error: {message}"), err[-1]
    assert snapshot(workdir) == before  # every input as it was, nothing written


def test_an_output_file_apart_from_every_input_is_written(workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    assert main([*GEN, "--out", "apart.jsonl", "--stats-json", "apart-stats.json", "--threads", "1"]) == 0
    assert len((workdir / "apart.jsonl").read_text().splitlines()) == 2 and (workdir / "apart-stats.json").is_file()


RL = ["rl", "--model", "model", "--data", "prompts.jsonl", "--out", "run", "--mode", "none", "--steps", "1",
      "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3", "--reward", "rewards:score",
      "--threads", "1"]
PLANTED = {  # what is planted at the run lock's path .run.pid -> the line it must give
    "a symbolic link to another file": (lambda lock, victim: lock.symlink_to(victim), "is a symbolic link"),
    "a hard link to another file": (lambda lock, victim: os.link(victim, lock), "is a hard link to another file"),
    "a directory": (lambda lock, victim: lock.mkdir(), "is a directory"),
}


@pytest.mark.parametrize("case", list(PLANTED))
def test_a_file_planted_at_a_run_lock_s_path_is_never_written(case, workdir, monkeypatch, capsys):
    """A planted link made `rl --out DIR` replace its target's content with the command's pid; a directory
    there raised IsADirectoryError. The lock file is created without following links; anything but a
    regular file of one link is refused, before the run starts."""
    monkeypatch.chdir(workdir)
    plant, message = PLANTED[case]
    victim, lock = workdir / "victim.txt", workdir / ".run.pid"
    victim.write_text("the victim's content\n")
    plant(lock, victim)
    try:
        assert main(RL) == 2
        line = capsys.readouterr().err.strip().splitlines()[-1]
        assert line == f"bebop: error: lock file {lock} {message}, not a lock file bebop wrote; remove it"
        assert victim.read_text() == "the victim's content\n" and not (workdir / "run").exists()
    finally:
        shutil.rmtree(lock) if lock.is_dir() and not lock.is_symlink() else lock.unlink()
    assert main(RL) == 0 and not lock.exists()  # removed, the run starts, and its own lock is gone after
    shutil.rmtree(workdir / "run")
