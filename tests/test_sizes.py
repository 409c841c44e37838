"""Sizes typed on the command line against what the machine can hold (``bebop.utils.memory``): each
refused in one line before anything is allocated, where they hung or exhausted memory before; nothing
written. A size that fits the machine may still be slow: only what cannot fit is refused."""

from __future__ import annotations

import pytest

from bebop.cli import main
from bebop.utils import memory
from tests.helpers.cli import model_workdir
from tests.helpers.models import tiny_model


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return model_workdir(tmp_path_factory.mktemp("sizes"))


MODEL = ["--model", "model", "--mtp", "head", "--threads", "1"]
RL = ["rl", *MODEL, "--data", "prompts.jsonl", "--out", "run", "--mode", "none", "--steps", "1",
      "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3", "--reward", "rewards:score"]
SIZES = {  # case -> argv, the line it must give (a substring)
    "rl --prompts-per-step 1e9": ([*RL, "--prompts-per-step", "1000000000"],
                                  "prompts_per_step x group_size = 2000000000 rollout rows need at least"),
    "rl --group-size 1e9": ([*RL, "--group-size", "1000000000"], "= 2000000000 rollout rows need at least"),
    "rl --steps 1e23": ([*RL, "--steps", "100000000000000000000000"],
                        "steps must be an integer in [1, 2**63 - 1], got 100000000000000000000000"),
    "generate --num-prompts 1e9": (["generate", *MODEL, "--num-prompts", "1000000000", "--out", "out.jsonl"],
                                   "1000000000 prompts need at least"),
    "check-lossless --samples 1e12": (["check-lossless", *MODEL, "--samples", "1000000000000", "--prompts",
                                       "prompts.jsonl"], "1000000000000 samples per configuration need at least"),
}


@pytest.mark.parametrize("case", list(SIZES))
def test_a_size_beyond_the_machine_is_one_line(case, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    argv, message = SIZES[case]
    assert main(argv) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("bebop: error: ") and message in line, line
    assert not (workdir / "run").exists() and not (workdir / "out.jsonl").exists()


def test_a_group_size_the_free_memory_cannot_hold_is_refused(workdir, monkeypatch, capsys):
    """--group-size 1e6 passed a preflight that counted only the KV cache (1.91 GiB here) and died in the
    prefill: its forward pass over the longest prompt is counted too, so 4 GiB free is not enough."""
    from bebop.models import load_model

    monkeypatch.chdir(workdir)
    monkeypatch.setattr(memory, "available_memory", lambda device: 4 * memory.GIB)
    assert main([*RL, "--group-size", "1000000"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    model, _ = load_model("model", device="cpu")
    rows, prompt = 2_000_000, 3  # BOS + "a b", then 3 new tokens (mode none: no verify slots)
    need = memory.kv_cache_bytes(model, rows, prompt + 3) + memory.forward_bytes(model, rows, prompt)
    assert memory.kv_cache_bytes(model, rows, 1 + 3) < 2 * memory.GIB < 4 * memory.GIB < need
    assert line == (f"bebop: error: prompts_per_step x group_size = 2000000 rollout rows need at least "
                    f"{need / memory.GIB:.3g} GiB of memory; cpu has 4 GiB free: lower --prompts-per-step, "
                    "--group-size or --max-new-tokens")
    assert not (workdir / "run").exists()


def test_train_mtp_checks_its_batch_against_the_memory_before_it_allocates(workdir, monkeypatch, capsys):
    """train-mtp --batch-size 1e9 died in the allocator (no preflight); refused in one line, nothing written."""
    monkeypatch.chdir(workdir)
    (workdir / "data.jsonl").write_text('{"token_ids": [1, 4, 5, 6, 7, 8, 9, 10], "start": 2}\n' * 4)
    argv = ["train-mtp", "--model", "model", "--data", "data.jsonl", "--out", "new-head", "--threads", "1"]
    assert main([*argv, "--batch-size", "1000000000"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("bebop: error: batch_size=1000000000 rows of at least 8 tokens need at least ") and \
        line.endswith(": lower --batch-size"), line
    assert not (workdir / "new-head").exists()


def test_forward_bytes_counts_the_residual_stream_the_mlp_and_the_last_logits():
    dense = tiny_model("llama", vocab_size=16)  # hidden 32, intermediate 64, float32
    assert memory.forward_bytes(dense, rows=1000, positions=3) == 1000 * (3 * (32 + 64) * 4 + 16 * 4)
    moe = tiny_model("mixtral", vocab_size=16)  # experts run over their own tokens: the residual stream only
    assert memory.forward_bytes(moe, rows=1000, positions=3) == 1000 * (3 * 32 * 4 + 16 * 4)


def test_a_model_larger_than_the_free_memory_is_refused_before_it_is_built(workdir, monkeypatch, capsys):
    """The weights a received config.json describes are checked against the device's free memory first."""
    monkeypatch.chdir(workdir)
    monkeypatch.setattr(memory, "available_memory", lambda device: 1000)
    assert main(["generate", *MODEL, "--mode", "none", "--out", "out.jsonl", "--prompts", "prompts.jsonl"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("bebop: error: the 19,616 parameters of model need at least ") and \
        line.endswith("cpu has 9.31e-07 GiB free: use a device with more free memory or --dtype bfloat16"), line
    assert not (workdir / "out.jsonl").exists()


def test_kv_cache_bytes_counts_every_attention_layer_s_keys_and_values():
    model = tiny_model("llama", vocab_size=16)  # 2 layers, 2 KV heads of 8, float32
    assert memory.kv_cache_bytes(model, rows=10, positions=7) == 10 * 7 * 2 * 2 * 2 * 8 * 4
    assert memory.samples_bytes(num_rows=3, num_tokens=12) == 3 * (8 + 40 + 8 * 12)
    assert memory.available_memory("cpu") > 0
