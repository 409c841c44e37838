"""The adversarial table of issue 10, kept as tests: every bad input gives one ``bebop: error:`` line
(exit 2) and no traceback; the rows marked "keep" pin behaviour that was already right.

Rows owned by issue 14 are not repeated here (see the comments in TABLE): output paths that are
directories, sit under a file or are not writable (generate, eval-mtp, train-mtp, rl, report);
``pretrain --out`` an existing file; ``pretrain --steps 0``; two processes on one empty cache.
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
from tests.conftest import save_model_dir, tiny_model, tiny_tokenizer

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
            "number-prompt.jsonl": [{"prompt": "a b"}, {"prompt": 7}]}
    for name, content in rows.items():
        (root / name).write_text("".join(json.dumps(r) + "\n" for r in content))
    (root / "bool-k.toml").write_text("# bebop train-mtp --config bool-k.toml\nspeculate_k = true\n")
    (root / "bool-k-rl.toml").write_text("# bebop rl --config bool-k-rl.toml\nspeculate_k = true\n")
    (root / "bad_rewards.py").write_text(REWARDS)
    return root


GEN = ["generate", "--mode", "none", "--out", "out.jsonl", "--prompts", "prompts.jsonl"]
EVAL = ["eval-mtp", "--model", "model", "--mtp", "head", "--data", "ok.jsonl"]
TRAIN = ["train-mtp", "--model", "model", "--data", "ok.jsonl", "--out", "new-head", "--steps", "1"]
LOSSLESS = ["check-lossless", "--mtp", "head", "--samples", "100", "--prompts", "prompts.jsonl"]

TABLE = {  # case (command): argv, the error line it must give (regex)
    "truncated model.safetensors (generate)": ([*GEN, "--model", "truncated"], r"truncated \(model.safetensors\)"),
    "zero-length model.safetensors (generate)": ([*GEN, "--model", "empty"], r"empty \(model.safetensors\)"),
    "truncated model.safetensors (eval-mtp)": ([*EVAL[:1], "--model", "truncated", *EVAL[3:]],
                                               r"\(model.safetensors\)"),
    "truncated model.safetensors (train-mtp)": ([*TRAIN[:1], "--model", "truncated", *TRAIN[3:]],
                                                r"\(model.safetensors\)"),
    "truncated model.safetensors (rl)": ([*RL[:1], "--model", "truncated", *RL[3:]], r"\(model.safetensors\)"),
    "truncated model.safetensors (check-lossless)": ([*LOSSLESS, "--model", "truncated"], r"\(model.safetensors\)"),
    "truncated head model.safetensors (generate)": ([*GEN[:2], "rs", *GEN[3:], "--model", "model", "--mtp",
                                                     "head-truncated"], r"corrupt MTP head in head-truncated"),
    # issue 14: --out/--json an existing directory, under a regular file, or not writable; pretrain --out a file.
    "token id beyond the vocabulary (eval-mtp)": ([*EVAL[:6], "big-id.jsonl"], r"big-id.jsonl line 2: token id 99"),
    "negative token id (train-mtp)": ([*TRAIN[:3], "--data", "negative-id.jsonl", *TRAIN[5:]],
                                      r"negative-id.jsonl line 1: token id -3"),
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
                                           r"'speculate_k' should be int, got True"),
    # issue 14: pretrain --steps 0 or negative.
    "model whose weights give NaN logits (generate)": ([*GEN, "--model", "nan-model"], r"NaN or infinite logits"),
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
    "rl --resume DIR where DIR holds no run": (["rl", "--resume", "empty-dir"], r"nothing to resume"),
    "--device nonsense": ([*GEN, "--model", "model", "--device", "nonsense"], r"unknown device 'nonsense'"),
    "--device cuda without CUDA": ([*GEN, "--model", "model", "--device", "cuda"], r"CUDA is not available"),
    "--dtype float16 (issue 12: auto, float32 or bfloat16)": ([*GEN, "--model", "model", "--dtype", "float16"],
                                                              r"unsupported dtype 'float16'; use auto, float32"),
    # issue 14: two processes on one empty cache.
}


@pytest.mark.parametrize("case", list(TABLE))
def test_bad_input_is_one_line(case, workdir, monkeypatch, capsys):
    argv, message = TABLE[case]
    if "cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
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
