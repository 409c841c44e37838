"""The ``bebop`` command on a user's own model (a tiny Llama with a BOS-adding tokenizer), as the README's
"Use it on your own model" section runs it: run directories that resume on their own, reward specs
checked first, one-line errors, fast --help, --threads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bebop.cli import main
from bebop.mtp.data import Sequences
from bebop.mtp.train import TrainMtpConfig, train_mtp
from tests.helpers.cli import save_model_dir
from tests.helpers.models import tiny_model

REWARD_MODULE = "def score(prompts, completions, **_):\n    return [float(len(c)) for c in completions]\n"
RL_ARGS = ["--mode", "none", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "4",
           "--reward", "my_rewards:score", "--save-every", "1"]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A folder holding a model, a prompt file and my_rewards.py, as the current directory."""
    save_model_dir(tmp_path / "model", tiny_model("llama", vocab_size=16))
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("a b", "c d e")))
    (tmp_path / "my_rewards.py").write_text(REWARD_MODULE)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("bebop: error: ")
    return err[-1]


def test_rl_data_without_task_uses_the_file_and_a_cwd_reward_module(workdir):
    assert main(["rl", "--model", "model", "--data", "prompts.jsonl", "--steps", "1", "--out", "run", *RL_ARGS]) == 0
    config = json.loads((workdir / "run" / "config.json").read_text())
    assert config["task"] == "math" and config["data"] == "prompts.jsonl"
    row = json.loads((workdir / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert row["reward_mean"] > 0  # my_rewards.score ran on the file's prompts


def test_resume_remembers_the_model_and_refuses_another(workdir, capsys):
    assert main(["rl", "--model", "model", "--data", "prompts.jsonl", "--steps", "1", "--out", "run", *RL_ARGS]) == 0
    config = json.loads((workdir / "run" / "config.json").read_text())
    assert config["model"] == str((workdir / "model").resolve()) and config["mtp"] is None
    assert main(["rl", "--resume", "run", "--steps", "2", "--reward", "my_rewards:score"]) == 0  # the run's model
    assert len((workdir / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    assert not list(Path(os.environ["BEBOP_CACHE_DIR"]).glob("embedded-*"))  # nothing pretrained on the side
    save_model_dir(workdir / "other", tiny_model("llama", vocab_size=16, seed=1))
    assert main(["rl", "--resume", "run", "--model", "other", "--steps", "3"]) == 2
    assert "cannot resume run with --model" in _error_line(capsys)
    (workdir / "empty").mkdir()
    assert main(["rl", "--resume", "empty"]) == 2
    assert "nothing to resume" in _error_line(capsys)


def test_reward_spec_is_checked_before_the_model_loads(workdir, capsys):
    assert main(["rl", "--model", "no-such-model", "--data", "prompts.jsonl", "--out", "run", *RL_ARGS[:-4],
                 "--reward", "no_such_module:score"]) == 2
    assert "cannot import reward module 'no_such_module'" in _error_line(capsys)
    assert not (workdir / "run").exists()


def test_reward_that_raises_is_named(workdir, capsys):
    (workdir / "broken_rewards.py").write_text("def broken(prompts, completions, **_):\n    return 1 / 0\n")
    args = ["rl", "--model", "model", "--data", "prompts.jsonl", "--steps", "1", "--out", "run", *RL_ARGS[:-4],
            "--reward", "broken_rewards:broken"]
    assert main(args) == 2
    assert "step 1: reward function broken raised ZeroDivisionError: division by zero" in _error_line(capsys)


def test_run_label_comes_from_the_heads_own_loss(workdir):
    model = tiny_model("llama", vocab_size=16)
    seqs = Sequences([[1, 4, 5, 6, 7, 8, 9]] * 4, [2] * 4)
    train_mtp(model, seqs, workdir / "head", TrainMtpConfig(loss="ce", steps=1, batch_size=2, speculate_k=2, save_every=0),
              show_progress=False)
    assert main(["rl", "--model", "model", "--mtp", "head", "--data", "prompts.jsonl", "--steps", "1", "--out", "run",
                 *RL_ARGS]) == 0
    config = json.loads((workdir / "run" / "config.json").read_text())
    assert config["mtp_loss"] == "ce" and config["mtp"] == str((workdir / "head").resolve())


def test_generate_mode_none_prints_no_nan(workdir, capsys):
    assert main(["generate", "--model", "model", "--mode", "none", "--prompts", "prompts.jsonl", "--out", "o.jsonl",
                 "--max-new-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "accept length" not in out


@pytest.mark.parametrize("device, message", [("nonsense", "unknown device 'nonsense'"),
                                             ("cuda", "CUDA is not available")])
def test_bad_device_is_one_line(workdir, capsys, device, message):
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["generate", "--model", "model", "--mode", "none", "--prompts", "prompts.jsonl", "--out", "o.jsonl",
                 "--device", device]) == 2
    assert message in _error_line(capsys)


def test_threads_flag_on_every_command(workdir, capsys):
    from bebop.cli import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    assert all("--threads" in p.format_help() for p in commands.values())
    before = torch.get_num_threads()
    try:
        assert main(["generate", "--model", "model", "--mode", "none", "--prompts", "prompts.jsonl", "--out", "o.jsonl",
                     "--max-new-tokens", "2", "--threads", "1"]) == 0
        assert torch.get_num_threads() == 1
        for threads in ("0", "100000"):  # 100000 threads crashed torch with a segfault
            assert main(["generate", "--model", "model", "--out", "o.jsonl", "--threads", threads]) == 2
            assert f"threads must be an integer in [1, {os.cpu_count()}] (this machine's CPUs), got {threads}" in \
                _error_line(capsys)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_help_does_not_import_torch():
    code = "import sys; from bebop.cli import build_parser; build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_config_file_takes_every_setting_model_and_head_included(workdir, capsys):
    """Every command but report takes --config: its keys are the command's flags (model, head, data and
    out included), and a flag overrides the file."""
    model = tiny_model("llama", vocab_size=16)
    seqs = Sequences([[1, 4, 5, 6, 7, 8, 9]] * 4, [2] * 4)
    (workdir / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in seqs.to_jsonl_rows()))
    (workdir / "train.toml").write_text('# bebop train-mtp --config train.toml\nmodel = "model"\ndata = "data.jsonl"\n'
                                        'out = "head"\nsteps = 1\nbatch_size = 2\nspeculate_k = 2\nthreads = 1\n')
    assert main(["train-mtp", "--config", "train.toml"]) == 0 and (workdir / "head" / "mtp_config.json").is_file()
    (workdir / "rl.yaml").write_text("# bebop rl --config rl.yaml\nmodel: model\nmtp: head\ndata: prompts.jsonl\n"
                                     "out: run\nmode: rs\nspeculate_k: 2\nsteps: 1\nprompts_per_step: 2\ngroup_size: 2\n"
                                     "max_new_tokens: 4\nreward: my_rewards:score\n")
    assert main(["rl", "--config", "rl.yaml", "--steps", "2"]) == 0  # the flag overrides the file's steps
    config = json.loads((workdir / "run" / "config.json").read_text())
    assert (config["model"], config["mtp"]) == (str((workdir / "model").resolve()), str((workdir / "head").resolve()))
    assert (config["steps"], config["mode"]) == (2, "rs") and len((workdir / "run" / "metrics.jsonl").read_text()
                                                                   .splitlines()) == 2
    (workdir / "gen.toml").write_text('model = "model"\nmtp = "head"\nprompts = "prompts.jsonl"\nout = "o.jsonl"\n'
                                      'max_new_tokens = 3\nstop = ["e"]\n')
    assert main(["generate", "--config", "gen.toml"]) == 0 and len((workdir / "o.jsonl").read_text().splitlines()) == 2
    (workdir / "bad.toml").write_text('out = "o.jsonl"\nmax_new_tokens = "many"\n')
    assert main(["generate", "--config", "bad.toml"]) == 2
    assert "config key 'max_new_tokens' should be int, got 'many'" in _error_line(capsys)


def test_every_flag_of_every_subcommand_comes_from_a_declared_setting(capsys):
    """One home per setting: each subcommand's flags are the fields of its settings classes (help, choices
    and check declared there), plus --config; report's positional runs and its flags are its own."""
    import bebop
    from bebop.cli import COMMANDS, _settings, build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    for name, parser in commands.items():
        settings = _settings(COMMANDS[name])
        declared = {alias for key, flag in settings.items()
                    for alias in ("--" + key.replace("_", "-"), *flag.aliases)}
        for action in parser._actions:
            flags = [s for s in action.option_strings if s.startswith("--") and not s.startswith("--no-")]
            if not flags or flags[0] in ("--help", "--config") or name == "report" and action.dest != "threads":
                continue
            assert set(flags) <= declared, (name, flags)
            assert action.help and settings[action.dest].help in action.help, (name, flags)
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0 and capsys.readouterr().out.strip() == f"bebop {bebop.__version__}"
