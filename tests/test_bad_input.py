"""Bad input, one table of cases as a user would type them: every bad input gives one ``bebop: error:``
line (exit 2) and no traceback; the rows marked "keep" pin behaviour that was already right.

Rows that tests/test_lose_nothing.py pins are not repeated here (see the comments in TABLE): output
paths that are directories, sit under a file or are not writable (generate, eval-mtp, train-mtp, rl,
report); ``pretrain --out`` an existing file; ``pretrain --steps 0``; two processes on one empty cache.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from bebop.cli import main
from bebop.mtp import MtpHead
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from tests.helpers.cli import save_model_dir
from tests.helpers.models import tiny_model, tiny_tokenizer

REWARDS = """
def raises(prompts, completions, **_):
    raise KeyError("no such field")
def returns_none(prompts, completions, **_):
    return None
def no_fields(prompts, completions):
    return [1.0] * len(completions)
def returns_nan(prompts, completions, **_):
    return [float("nan")] * len(completions)
def returns_inf(prompts, completions, **_):
    return [float("inf")] * len(completions)
def exits(prompts, completions, **_):
    raise SystemExit(0)
def huge(prompts, completions, **_):
    return [1e308 * (i % 2) for i in range(len(completions))]
def near_float32_max(prompts, completions, **_):
    return [3e38] * len(completions)
"""
RL = ["rl", "--model", "model", "--data", "prompts.jsonl", "--out", "run", "--mode", "none", "--steps", "1",
      "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A model with its head, broken copies of both, data and prompt files, a reward module."""
    root = tmp_path_factory.mktemp("bad-input")
    model = tiny_model("llama", vocab_size=16)
    save_model_dir(root / "model", model)
    MtpHead(model).save_pretrained(root / "head")
    weights = (root / "model" / "model.safetensors").read_bytes()
    for name, data in (("truncated", weights[:100]), ("empty", b"")):
        shutil.copytree(root / "model", root / name)
        (root / name / "model.safetensors").write_bytes(data)
    shutil.copytree(root / "model", root / "bin-model")  # a corrupt pickled pytorch_model.bin
    (root / "bin-model" / "model.safetensors").unlink()
    (root / "bin-model" / "pytorch_model.bin").write_bytes(b"\x80\x04not a pickle")
    shutil.copytree(root / "head", root / "head-truncated")
    (root / "head-truncated" / "model.safetensors").write_bytes(b"\x00" * 10)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    save_model_dir(root / "nan-model", model)
    rows = {"ok.jsonl": [{"token_ids": [1, 4, 5, 6, 7, 8, 9, 10], "start": 2}] * 4,
            "big-id.jsonl": [{"token_ids": [1, 4, 5, 6, 7], "start": 1}, {"token_ids": [1, 4, 99, 6, 7], "start": 1}],
            "negative-id.jsonl": [{"token_ids": [1, 4, -3, 6, 7], "start": 1}],
            "prompts.jsonl": [{"prompt": "a b"}, {"prompt": "c d"}],
            "long.jsonl": [{"token_ids": [1, 4, 5, 6, 7], "start": 1}, {"token_ids": [1] + [4] * 300, "start": 1}],
            "number-prompt.jsonl": [{"prompt": "a b"}, {"prompt": 7}]}
    for name, content in rows.items():
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in content))
    (root / "latin1.jsonl").write_bytes('{"prompt": "a b"}\n{"prompt": "caf\u00e9"}\n'.encode("latin-1"))
    (root / "latin1.txt").write_bytes("a b\ncaf\u00e9\n".encode("latin-1"))
    (root / "latin1-data.jsonl").write_bytes(('{"token_ids": [1, 4, 5, 6, 7, 8, 9, 10], "start": 2}\n'
                                              '{"text": "caf\u00e9"}\n').encode("latin-1"))
    (root / "latin1.toml").write_bytes("# bebop rl --config latin1.toml (caf\u00e9)\nsteps = 1\n".encode("latin-1"))
    (root / "huge-seed.toml").write_text(f"# bebop rl --config huge-seed.toml\nseed = {2**64}\n")
    (root / "unknown-words.txt").write_text("x y z a\nb c\n")
    (root / "bool-k.toml").write_text("# bebop train-mtp --config bool-k.toml\nspeculate_k = true\n")
    (root / "bool-k-rl.toml").write_text("# bebop rl --config bool-k-rl.toml\nspeculate_k = true\n")
    (root / "bad_rewards.py").write_text(REWARDS)
    shutil.copytree(root / "model", root / "strict-template")  # a template that refuses roles other than its own
    (root / "strict-template" / "chat_template.jinja").unlink(missing_ok=True)
    strict = tiny_tokenizer()
    strict.chat_template = ("{% for m in messages %}{% if m['role'] not in ['user', 'assistant', 'system'] %}"
                            "{{ raise_exception('Conversation roles must be user, assistant or system') }}{% endif %}"
                            "{{ m['content'] }} {% endfor %}")
    strict.save_pretrained(root / "strict-template")
    rows = {"robot-role.jsonl": [{"prompt": [{"role": "robot", "content": "a b"}]}, {"prompt": "c d"}],
            "two-token-completions.jsonl": [{"token_ids": [1, 4, 5, 6], "start": 2}] * 4,
            "text-number.jsonl": [{"text": "a b c"}, {"text": 12345}],
            "float-ids.jsonl": [{"token_ids": [1, 4, 5.5, 6], "start": 1}]}
    for name, content in rows.items():
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in content))
    (root / "surrogate.jsonl").write_text('{"prompt": "a b"}\n{"prompt": "c \\ud800 d"}\n')
    save_model_dir(root / "no-bos", model, add_bos=False)  # "" encodes to no tokens
    (root / "prompts-dir.jsonl").mkdir()
    os.mkfifo(root / "prompts.fifo")
    (root / "empty-prompt.jsonl").write_text('{"prompt": "a b"}\n{"prompt": ""}\n')
    (root / "twice.yaml").write_text("# bebop rl --config twice.yaml\nsteps: 1\ngroup_size: 2\nsteps: 5\n")
    (root / "surrogate-data.jsonl").write_text('{"prompt": "a b", "completion": "c \\udc00"}\n')
    return root


GEN = ["generate", "--mode", "none", "--out", "out.jsonl", "--prompts", "prompts.jsonl"]
EVAL = ["eval-mtp", "--model", "model", "--mtp", "head", "--data", "ok.jsonl"]
TRAIN = ["train-mtp", "--model", "model", "--data", "ok.jsonl", "--out", "new-head", "--steps", "1"]
LOSSLESS = ["check-lossless", "--mtp", "head", "--samples", "100", "--prompts", "prompts.jsonl"]

TABLE = {  # case (command): argv, the error line it must give (regex)
    "truncated model.safetensors (generate)": ([*GEN, "--model", "truncated"],
                                               r"cannot load model from truncated: weights file model.safetensors is "
                                               "corrupt"),
    "zero-length model.safetensors (generate)": ([*GEN, "--model", "empty"],
                                                 r"from empty: weights file model.safetensors is corrupt: .*too small"),
    "truncated model.safetensors (eval-mtp)": ([*EVAL[:1], "--model", "truncated", *EVAL[3:]],
                                               r"weights file model.safetensors is corrupt"),
    "truncated model.safetensors (train-mtp)": ([*TRAIN[:1], "--model", "truncated", *TRAIN[3:]],
                                                r"weights file model.safetensors is corrupt"),
    "truncated model.safetensors (rl)": ([*RL[:1], "--model", "truncated", *RL[3:]],
                                         r"weights file model.safetensors is corrupt"),
    "truncated model.safetensors (check-lossless)": ([*LOSSLESS, "--model", "truncated"],
                                                     r"weights file model.safetensors is corrupt"),
    "corrupt pickled pytorch_model.bin (generate)": ([*GEN, "--model", "bin-model"],
                                                     r"cannot load model from bin-model \(pytorch_model.bin\): not a "
                                                     r"file of tensors"),
    "truncated head model.safetensors (generate)": ([*GEN[:2], "rs", *GEN[3:], "--model", "model", "--mtp",
                                                     "head-truncated"], r"corrupt MTP head in head-truncated"),
    # test_lose_nothing.py: --out/--json an existing directory, under a regular file, or not writable; pretrain
    # --out a file. Here: an output place where nothing can be created (/proc; as root a chmod'ed directory is
    # writable, so /proc stands for every such place), refused before the work.
    "--out under /proc (generate)": ([*GEN[:4], "/proc/bebop/out.jsonl", *GEN[5:], "--model", "model"],
                                     r"--out file /proc/bebop/out.jsonl: cannot write in /proc$"),
    "--json under /proc (eval-mtp)": ([*EVAL, "--json", "/proc/bebop/e.json"], r"--json file .*cannot write in /proc$"),
    "--out under /proc (train-mtp)": ([*TRAIN[:5], "--out", "/proc/bebop/head", *TRAIN[7:]],
                                      r"head directory /proc/bebop/head: cannot write in /proc$"),
    "--out under /proc (rl)": ([*RL[:5], "--out", "/proc/bebop/run", *RL[7:]],
                               r"run directory /proc/bebop/run: cannot write in /proc$"),
    "--out under /proc (report)": (["report", "empty-dir", "--out", "/proc/bebop/report"],
                                   r"report directory /proc/bebop/report: cannot write in /proc$"),
    "token id beyond the vocabulary (eval-mtp)": ([*EVAL[:6], "big-id.jsonl"], r"big-id.jsonl line 2: token id 99"),
    "negative token id (train-mtp)": ([*TRAIN[:3], "--data", "negative-id.jsonl", *TRAIN[5:]],
                                      r"negative-id.jsonl line 1: token id -3"),
    "rows beyond the model's positions, K=1 (train-mtp)": (  # the tiny model has 256
        [*TRAIN[:3], "--data", "long.jsonl", *TRAIN[5:], "--speculate-k", "1"],
        r"long.jsonl line 2: 301 tokens exceed the model's max_position_embeddings=256"),
    "rows beyond the model's positions, K=1 (eval-mtp)": ([*EVAL[:6], "long.jsonl", "--speculate-k", "1"],
                                                          r"long.jsonl line 2: 301 tokens exceed"),
    "eval-mtp --speculate-k 0": ([*EVAL, "--speculate-k", "0"], r"speculate_k must be an integer >= 1, got 0"),
    "eval-mtp --speculate-k -2": ([*EVAL, "--speculate-k", "-2"], r"speculate_k must be an integer >= 1"),
    "eval-mtp --speculate-k deeper than the data": ([*EVAL, "--speculate-k", "50"], r"deeper than the data allows"),
    "train-mtp --speculate-k 100": ([*TRAIN, "--speculate-k", "100"], r"speculate_k=100 is deeper than the data"),
    "train-mtp --temperature 0": ([*TRAIN, "--temperature", "0"], r"temperature must be a finite number > 0"),
    "train-mtp --temperature -1": ([*TRAIN, "--temperature", "-1"], r"temperature must be a finite number > 0"),
    "train-mtp --temperature nan": ([*TRAIN, "--temperature", "nan"], r"temperature must be a finite number > 0"),
    "generate --temperature inf": ([*GEN, "--model", "model", "--temperature", "inf"], r"temperature must be a finite number"),
    "a bool for K in a config file (train-mtp)": ([*TRAIN, "--config", "bool-k.toml"],
                                                  r"'speculate_k' should be int, got True"),
    "a bool for K in a config file (rl)": ([*RL, "--config", "bool-k-rl.toml"],
                                           r"speculate_k must be an integer >= 1 or 'auto', got True"),
    # test_lose_nothing.py: pretrain --steps 0 or negative.
    "model whose weights give NaN logits (generate)": ([*GEN, "--model", "nan-model"], r"NaN or infinite logits"),
    "non-UTF-8 JSONL prompts (generate)": ([*GEN[:6], "latin1.jsonl", "--model", "model"],
                                           r"prompt file latin1.jsonl is not UTF-8 text: line 2 has byte 0xe9"),
    "non-UTF-8 text prompts (generate)": ([*GEN[:6], "latin1.txt", "--model", "model"],
                                          r"prompts file latin1.txt is not UTF-8 text: line 2 has byte 0xe9"),
    "non-UTF-8 data (train-mtp)": ([*TRAIN[:3], "--data", "latin1-data.jsonl", *TRAIN[5:]],
                                   r"data file latin1-data.jsonl is not UTF-8 text: line 2"),
    "non-UTF-8 prompt file (rl)": ([*RL[:3], "--data", "latin1.jsonl", *RL[5:]],
                                   r"prompt file latin1.jsonl is not UTF-8 text: line 2"),
    "non-UTF-8 config file (rl)": ([*RL, "--config", "latin1.toml"],
                                   r"config file latin1.toml is not UTF-8 text: line 1"),
    "prompt field that is a number (generate)": ([*GEN[:6], "number-prompt.jsonl", "--model", "model"],
                                                 r"number-prompt.jsonl:2: 'prompt' must be a string or a list"),
    "reward function that raises (rl)": ([*RL, "--reward", "bad_rewards:raises"],
                                         r"reward function raises raised KeyError: 'no such field'"),
    "reward function that returns None (rl)": ([*RL, "--reward", "bad_rewards:returns_none"],
                                               r"reward function returns_none must return a list of numbers"),
    "reward function that does not accept the data fields (rl)": (
        [*RL[:3], "--data", "ok-answers.jsonl", *RL[5:], "--reward", "bad_rewards:no_fields"],
        r"reward function no_fields raised TypeError: .*unexpected keyword argument 'answer'"),
    "math reward and no answer column (rl)": ([*RL, "--reward", "math"],
                                              r"prompts.jsonl:1: the reward needs field\(s\) \['answer'\]"),
    "reward function returning NaN (rl)": ([*RL, "--reward", "bad_rewards:returns_nan"], r"step 1: .*returned nan"),
    "reward function returning inf (rl)": ([*RL, "--reward", "bad_rewards:returns_inf"], r"step 1: .*returned inf"),
    "reward function raising SystemExit(0) (rl)": ([*RL, "--reward", "bad_rewards:exits"],
                                                   r"step 1: reward function exits raised SystemExit: 0"),
    "reward function returning 1e308 (rl)": ([*RL, "--reward", "bad_rewards:huge"],
                                             r"step 1: reward function huge returned 1e\+308, beyond float32"),
    "rewards whose group mean overflows float32 (rl)": (
        [*RL, "--reward", "bad_rewards:near_float32_max"],
        r"step 1: reward function near_float32_max gave rewards up to 3e\+38 .* advantages are not finite"),
    "a seed beyond 64 bits in a config file (rl)": ([*RL, "--config", "huge-seed.toml"],
                                                   r"seed must be an integer in \[0, 2\*\*63 - 1\], got "
                                                   f"{2**64}"),
    "rl --resume DIR where DIR holds no run": (["rl", "--resume", "empty-dir"], r"nothing to resume"),
    "check-lossless on a model whose tokenizer does not know the task prompts": (
        [*LOSSLESS[:5], "--model", "model"],
        r"the tested prompt 'Q [^']*' is (\d+) of \1 unknown tokens .*the embedded task's prompts.*give --prompts"),
    "check-lossless --prompts mostly unknown tokens": ([*LOSSLESS[:6], "unknown-words.txt", "--model", "model"],
                                                       r"the tested prompt 'x y z a' is 3 of 4 unknown tokens"),
    "--device nonsense": ([*GEN, "--model", "model", "--device", "nonsense"], r"unknown device 'nonsense'"),
    "--device cuda without CUDA": ([*GEN, "--model", "model", "--device", "cuda"], r"CUDA is not available"),
    "--dtype float16 (auto, float32 or bfloat16)": ([*GEN, "--model", "model", "--dtype", "float16"],
                                                              r"unsupported dtype 'float16'; use auto, float32"),
    # test_lose_nothing.py: two processes on one empty cache.
    "chat roles the model's template refuses (generate)": (
        [*GEN[:6], "robot-role.jsonl", "--model", "strict-template"],
        r"robot-role.jsonl:1: the model's chat template refuses these messages: Conversation roles must be"),
    "chat roles the model's template refuses (rl)": (
        [*RL[:1], "--model", "strict-template", "--data", "robot-role.jsonl", *RL[5:], "--reward",
         "bad_rewards:no_fields"],
        r"robot-role.jsonl:1: the model's chat template refuses these messages"),
    "chat roles the model's template refuses (check-lossless)": (
        [*LOSSLESS[:5], "--prompts", "robot-role.jsonl", "--model", "strict-template"],
        r"robot-role.jsonl:1: the model's chat template refuses these messages"),
    "a lone surrogate in a prompt (generate)": ([*GEN[:6], "surrogate.jsonl", "--model", "model"],
                                                r"surrogate.jsonl:2: prompt holds a lone surrogate U\+D800 at character 3"),
    "a lone surrogate in a prompt (rl)": ([*RL[:3], "--data", "surrogate.jsonl", *RL[5:], "--reward",
                                           "bad_rewards:no_fields"],
                                          r"surrogate.jsonl:2: prompt holds a lone surrogate U\+D800"),
    "a lone surrogate in a completion (train-mtp)": ([*TRAIN[:3], "--data", "surrogate-data.jsonl", *TRAIN[5:]],
                                                     r"surrogate-data.jsonl line 1: a completion holds a lone "
                                                     r"surrogate U\+DC00"),
    "a text that is a number (eval-mtp)": ([*EVAL[:6], "text-number.jsonl"],
                                           r"data file text-number.jsonl line 2: 'text' must be a string, got int 12345"),
    "token ids that are not integers (train-mtp)": ([*TRAIN[:3], "--data", "float-ids.jsonl", *TRAIN[5:]],
                                                    r"float-ids.jsonl line 1: 'token_ids' must be a list of integers"),
    "--prompts naming a directory (generate; it said \"not found\")": (
        [*GEN[:6], "prompts-dir.jsonl", "--model", "model"],
        r"prompts file prompts-dir.jsonl is a directory, not a file"),
    "--prompts naming a FIFO (generate; reading it would block)": (
        [*GEN[:6], "prompts.fifo", "--model", "model"],
        r"prompts file prompts.fifo is not a regular file \(a pipe, a device or standard input\): save it to a file"),
    "--data naming a directory (rl)": ([*RL[:3], "--data", "prompts-dir.jsonl", *RL[5:]],
                                      r"prompt file prompts-dir.jsonl is a directory, not a file"),
    "--config naming a FIFO (rl)": ([*RL, "--config", "prompts.fifo"],
                                    r"config file prompts.fifo is not a regular file"),
    "an empty prompt names its file and line (generate; the engine's error named neither)": (
        [*GEN[:6], "empty-prompt.jsonl", "--model", "no-bos"],
        r"empty-prompt.jsonl:2: empty prompt: the tokenizer gives it no tokens"),
    "a key given twice in a YAML --config (the last one was taken silently)": (
        [*RL, "--config", "twice.yaml"], r"cannot parse config file twice.yaml: key 'steps' is given twice \(again on "
                                         r"line 4\)"),
    "train-mtp --log-every 0": ([*TRAIN, "--log-every", "0"], r"log_every must be an integer in \[1, "),
    "generate --temperature 1e-45 (blamed the head)": ([*GEN[:2], "rs", *GEN[3:], "--model", "model", "--mtp", "head",
                                                        "--temperature", "1e-45"],
                                                       r"temperature must be 0 \(greedy\) or at least 0.01 \(below it "
                                                       r"logits / T overflow float32\), got 1e-45"),
    "train-mtp's default K on 2-token completions names the flag": (
        [*TRAIN[:3], "--data", "two-token-completions.jsonl", *TRAIN[5:]],
        r"speculate_k=5 is deeper than the data allows: its longest completion has 2 tokens, room for chains of 1 "
        r"drafts; give --speculate-k 1 or less \(train-mtp drafts 5 deep by default, generate and rl 3\)"),
}


@pytest.mark.parametrize("case", list(TABLE))
def test_bad_input_is_one_line(case, workdir, monkeypatch, capsys):
    argv, message = TABLE[case]
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if any(a.startswith("/proc/") for a in argv) and not Path("/proc/self").is_dir():
        pytest.skip("this machine has no /proc")
    monkeypatch.chdir(workdir)
    (workdir / "empty-dir").mkdir(exist_ok=True)
    (workdir / "ok-answers.jsonl").write_text(json.dumps({"prompt": "a", "answer": "1"}) + "\n")
    for leftover in ("run", "new-head", "out.jsonl"):
        shutil.rmtree(workdir / leftover, ignore_errors=True) if (workdir / leftover).is_dir() else \
            (workdir / leftover).unlink(missing_ok=True)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("bebop: error: ") and "Traceback" not in "\n".join(err)
    assert re.search(message, err[-1]), err[-1]
    assert not (workdir / "new-head").exists() and not (workdir / "out.jsonl").exists()  # nothing half-written
    assert not (workdir / "run").exists()  # an rl run whose first step failed leaves no run directory


def test_prompts_from_standard_input_are_named_as_such(workdir, monkeypatch, capsys):
    """/dev/stdin on a terminal, a pipe or /dev/null is not a file Bebop can check before the model loads
    (it said "not found"); redirected from a file it is one, and reads as one."""
    if Path("/dev/stdin").is_file() or not Path("/dev/stdin").exists():
        pytest.skip("standard input is a regular file (or absent) here")
    monkeypatch.chdir(workdir)
    assert main([*GEN[:6], "/dev/stdin", "--model", "model"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == ("bebop: error: prompts file /dev/stdin is not a regular file (a pipe, a device or standard input): "
                    "save it to a file and give that")


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(workdir, monkeypatch):
    """A text prompts file saved with a BOM (Windows editors) kept U+FEFF in its first prompt."""
    monkeypatch.chdir(workdir)
    (workdir / "bom.txt").write_bytes("\ufeffa b\nc d\n".encode("utf-8"))
    assert main([*GEN[:4], "bom-out.jsonl", "--prompts", "bom.txt", "--model", "model", "--max-new-tokens", "1"]) == 0
    rows = [json.loads(line) for line in (workdir / "bom-out.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["a b", "c d"]
    assert rows[0]["token_ids"][:3] == [1, 4, 5]  # BOS a b: nothing unknown before "a"


EVIL_REWARD = """import pathlib
pathlib.Path("reward-code-ran").write_text("imported")
def score(prompts, completions, **_):
    return [float(len(c)) for c in completions]
"""


def test_resume_runs_no_reward_code_its_command_does_not_name(workdir, monkeypatch, capsys):
    """A received run directory's reward file is imported only when --reward names it again."""
    monkeypatch.chdir(workdir)
    (workdir / "sent_reward.py").write_text(EVIL_REWARD)
    marker = workdir / "reward-code-ran"
    args = [*RL[:5], "--out", "sent-run", *RL[7:], "--save-every", "1"]
    assert main([*args, "--reward", "sent_reward.py:score"]) == 0
    marker.unlink()
    assert main(["rl", "--resume", "sent-run", "--steps", "2"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "used the reward 'sent_reward.py:score'" in line and line.endswith("add --reward sent_reward.py:score")
    assert main(["rl", "--resume", "sent-run", "--steps", "2", "--reward", "bad_rewards:no_fields"]) == 2
    assert "cannot resume sent-run with --reward bad_rewards:no_fields" in capsys.readouterr().err
    assert not marker.exists()  # neither command imported the run's reward file
    assert len((workdir / "sent-run" / "metrics.jsonl").read_text().splitlines()) == 1
    assert main(["rl", "--resume", "sent-run", "--steps", "2", "--reward", "./sent_reward.py:score"]) == 0
    assert marker.exists()  # named again (the same file by another path): it runs
    assert len((workdir / "sent-run" / "metrics.jsonl").read_text().splitlines()) == 2


def test_resume_with_a_builtin_reward_needs_no_flag(workdir, monkeypatch):
    monkeypatch.chdir(workdir)
    (workdir / "answers.jsonl").write_text(json.dumps({"prompt": "a b", "answer": "1"}) + "\n")
    args = [*RL[:3], "--data", "answers.jsonl", "--out", "math-run", *RL[7:], "--reward", "math"]
    assert main(args) == 0
    assert main(["rl", "--resume", "math-run", "--steps", "2"]) == 0
    assert len((workdir / "math-run" / "metrics.jsonl").read_text().splitlines()) == 2


STEP_TWO_REWARD = """import pathlib
def score(prompts, completions, **_):
    huge = pathlib.Path("make-rewards-huge").exists()
    return [(1e308 if huge else 1.0) * (i % 2) for i in range(len(completions))]
"""


def test_a_step_with_rewards_beyond_float32_writes_nothing_and_keeps_the_checkpoint(workdir, monkeypatch, capsys):
    """Rewards of 1e308 at step 2 stop the run in one line before the update; the log and the
    checkpoint of step 1 stay as they were (no NaN policy)."""
    monkeypatch.chdir(workdir)
    (workdir / "step_two_reward.py").write_text(STEP_TWO_REWARD)
    args = [*RL[:5], "--out", "huge-run", *RL[7:], "--save-every", "1", "--reward", "step_two_reward.py:score"]
    assert main(args) == 0
    checkpoint = workdir / "huge-run" / "checkpoint"
    before = {f.name: f.read_bytes() for f in checkpoint.iterdir()}
    metrics = (workdir / "huge-run" / "metrics.jsonl").read_text()
    (workdir / "make-rewards-huge").write_text("")
    try:
        assert main(["rl", "--resume", "huge-run", "--steps", "2", "--reward", "step_two_reward.py:score"]) == 2
    finally:
        (workdir / "make-rewards-huge").unlink()
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "step 2: reward function score returned 1e+308, beyond float32's range" in line
    assert {f.name: f.read_bytes() for f in checkpoint.iterdir()} == before
    assert (workdir / "huge-run" / "metrics.jsonl").read_text() == metrics


def test_failed_first_step_with_overwrite_puts_the_old_run_back(workdir, monkeypatch, capsys):
    """A run whose first step fails leaves no run directory; --overwrite's moved run returns."""
    monkeypatch.chdir(workdir)
    old = workdir / "kept-run"
    old.mkdir(exist_ok=True)
    (old / "config.json").write_text("{}")
    args = [*RL[:5], "--out", "kept-run", *RL[7:], "--overwrite", "--reward", "bad_rewards:exits"]
    assert main(args) == 2
    assert "raised SystemExit" in capsys.readouterr().err
    assert [p.name for p in old.iterdir()] == ["config.json"] and (old / "config.json").read_text() == "{}"
    assert not list(workdir.glob("kept-run.old-*"))


SEED_COMMANDS = {  # every --seed is checked by bebop.config.check_seed, naming the flag
    "generate": GEN, "check-lossless": LOSSLESS, "rl": RL, "train-mtp": TRAIN, "pretrain": ["pretrain", "--out", "p"],
}


@pytest.mark.parametrize("command", list(SEED_COMMANDS))
@pytest.mark.parametrize("seed", [str(2**64), str(2**63), "-1", "1.5"])
def test_a_seed_that_is_not_an_int64_names_the_flag(command, seed, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    with pytest.raises(SystemExit) as exit_:
        main([*SEED_COMMANDS[command], "--seed", seed])
    assert exit_.value.code == 2
    assert f"error: argument --seed: must be an integer in [0, 2**63 - 1], got '{seed}'" in capsys.readouterr().err
    assert not (workdir / "p").exists() and not (workdir / "run").exists()


class _Payload:
    def __reduce__(self):
        return (print, ("pickle payload ran",))


CHECKPOINT_DAMAGE = {  # file of a run's checkpoint -> what is done to it, the line it must give
    "rng.pt garbage": ("rng.pt", lambda f: f.write_bytes(b"garbage"), r"corrupt checkpoint file .*rng.pt: not a file"),
    "rng.pt missing": ("rng.pt", lambda f: f.unlink(), r"checkpoint file .*rng.pt is missing"),
    "rng.pt a pickled object": ("rng.pt", lambda f: torch.save(_Payload(), f), r"rng.pt: not a file of tensors"),
    "rng.pt of other tensors": ("rng.pt", lambda f: torch.save({"x": torch.zeros(1)}, f),
                                r"rng.pt: not RNG states \(KeyError"),
    "policy.pt garbage": ("policy.pt", lambda f: f.write_bytes(b"\x80\x04junk"),
                          r"corrupt checkpoint file .*policy.pt: "),
}


@pytest.mark.parametrize("case", list(CHECKPOINT_DAMAGE))
def test_a_damaged_checkpoint_file_is_one_line_naming_it(case, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    name, damage, message = CHECKPOINT_DAMAGE[case]
    if not (workdir / "ckpt-run").exists():
        assert main([*RL[:5], "--out", "ckpt-run", *RL[7:], "--reward", "bad_rewards:no_fields"]) == 0
    run = workdir / f"damaged-{name}-{len(list(workdir.glob('damaged-*')))}"
    shutil.copytree(workdir / "ckpt-run", run)
    damage(run / "checkpoint" / name)
    before = (run / "metrics.jsonl").read_text()
    assert main(["rl", "--resume", run.name, "--steps", "2", "--reward", "bad_rewards:no_fields"]) == 2
    out, err = capsys.readouterr()
    assert "pickle payload ran" not in out + err and "Traceback" not in err
    assert re.search(message, err.strip().splitlines()[-1]), err
    assert (run / "metrics.jsonl").read_text() == before  # the run is as it was


def test_corrupted_cached_embedded_model_says_how_to_rebuild(workdir, monkeypatch, capsys, tmp_path):
    from bebop import embedded

    monkeypatch.setenv("BEBOP_CACHE_DIR", str(tmp_path))
    shutil.copytree(workdir / "truncated", embedded.embedded_model_dir())
    assert main(["generate", "--mode", "none", "--out", str(tmp_path / "o.jsonl")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "cached embedded model: delete" in line and "pretrained again on next use" in line


# ---------------------------------------------------------------------------------------------- keep


SIGINT_RUNS = {  # command -> argv of a run long enough to be interrupted, and the file it writes once running
    "train-mtp": (["train-mtp", "--model", "model", "--data", "ok.jsonl", "--out", "sig-head", "--steps", "1000000",
                   "--batch-size", "2", "--speculate-k", "2"], "sig-head/metrics.jsonl"),
    "rl": (["rl", "--model", "model", "--data", "prompts.jsonl", "--out", "sig-run", "--mode", "none", "--steps",
            "1000000", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3", "--reward",
            "bad_rewards:no_fields"], "sig-run/metrics.jsonl"),
    "rl async": (["rl", "--model", "model", "--data", "prompts.jsonl", "--out", "sig-async", "--mode", "none",
                  "--steps", "1000000", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3",
                  "--reward", "bad_rewards:no_fields", "--async"], "sig-async/metrics.jsonl"),
}


@pytest.mark.parametrize("command", list(SIGINT_RUNS))
def test_sigint_is_interrupted_exit_130(command, workdir):
    """Keep: SIGINT during a long command prints "bebop: interrupted" and exits 130."""
    argv, marker = SIGINT_RUNS[command]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # NOTE: a shell's background job starts with SIGINT ignored, and Python keeps an ignored SIGINT ignored;
    # restore the default in the child so it behaves as in a terminal wherever the suite runs.
    proc = subprocess.Popen([sys.executable, "-m", "bebop.cli", *argv, "--threads", "1"], cwd=workdir, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 120
    while not (workdir / marker).is_file() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.2)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "bebop: interrupted"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not Path("/proc/self/statm").exists(), reason="needs /proc")
@pytest.mark.parametrize("mode", ["none", "to", "rs"])
def test_repeated_generation_keeps_memory_flat(mode):
    """Keep: many generate batches in one process do not grow its memory (bound: 20 MB over 150 batches)."""
    model = tiny_model("llama", vocab_size=16)
    head, tok = MtpHead(model), tiny_tokenizer()
    prompts = [[1, 4, 5], [1, 6], [1, 7, 8, 9]] * 2
    spec, sampling = SpecConfig(mode, 3), SamplingParams(temperature=1.0, max_new_tokens=8)

    def run(num: int) -> None:
        for step in range(num):
            generate(model, tok, prompts, mtp=head if mode != "none" else None, sampling=sampling, spec=spec, step=step)

    run(30)  # warm-up: allocator caches fill
    before = _rss_mb()
    run(150)
    assert _rss_mb() - before < 20
