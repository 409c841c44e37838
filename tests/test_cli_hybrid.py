"""Every sampling path of the ``bebop`` command on a user's hybrid model (Gated DeltaNet or Mamba2 layers beside
attention): train-mtp, generate (rs, block verification, auto), eval-mtp's served chains, check-lossless, and
rl with the engine backend (sync, async, auto), each as the README runs it, on a tiny saved model."""

from __future__ import annotations

import json

import pytest

from bebop.cli import main
from tests.helpers.cli import save_model_dir
from tests.helpers.models import tiny_model

REWARD_MODULE = "def score(prompts, completions, **_):\n    return [float(len(c)) for c in completions]\n"
PROMPTS = ("a b", "c d e", "f", "g h i j")
RL = ["--data", "prompts.jsonl", "--reward", "my_rewards:score", "--prompts-per-step", "2", "--group-size", "2",
      "--max-new-tokens", "6", "--save-every", "0", "--backend", "engine"]


@pytest.fixture(scope="module", params=["qwen3_5_hybrid", "nemotron_h"])
def workdir(request, tmp_path_factory):
    """A folder with a hybrid model, prompts, generated training data, a trained head and my_rewards.py."""
    root = tmp_path_factory.mktemp(request.param)
    save_model_dir(root / "model", tiny_model(request.param, vocab_size=16))
    (root / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS))
    (root / "my_rewards.py").write_text(REWARD_MODULE)
    mp = pytest.MonkeyPatch()
    mp.chdir(root)
    assert main(["generate", "--model", "model", "--mode", "none", "--prompts", "prompts.jsonl", "--max-new-tokens",
                 "12", "--out", "gen.jsonl"]) == 0
    assert main(["train-mtp", "--model", "model", "--data", "gen.jsonl", "--out", "head", "--steps", "2",
                 "--batch-size", "2", "--speculate-k", "2"]) == 0
    yield root
    mp.undo()


def test_generate_rs_and_block_and_auto(workdir):
    common = ["--model", "model", "--mtp", "head", "--prompts", "prompts.jsonl", "--max-new-tokens", "8"]
    for extra in (["--mode", "rs"], ["--mode", "rs", "--verify", "block"], ["--mode", "auto", "--speculate-k", "auto"]):
        out = f"out-{extra[-1]}.jsonl"
        assert main(["generate", *common, *extra, "--out", out]) == 0
        assert len((workdir / out).read_text().splitlines()) == len(PROMPTS)


def test_eval_mtp_served_chains(workdir):
    assert main(["eval-mtp", "--model", "model", "--mtp", "head", "--data", "gen.jsonl", "--speculate-k", "2",
                 "--chain-context", "served", "--json", "eval.json"]) == 0
    assert json.loads((workdir / "eval.json").read_text())["num_positions"] > 0


def test_check_lossless(workdir):
    assert main(["check-lossless", "--model", "model", "--mtp", "head", "--prompts", "prompts.jsonl",
                 "--samples", "200"]) == 0


@pytest.mark.parametrize("extra", [["--mode", "rs"], ["--mode", "rs", "--async-rollout"],
                                   ["--mode", "auto", "--speculate-k", "auto", "--auto-every", "1"]],
                         ids=["sync", "async", "auto"])
def test_rl_engine_backend(workdir, extra):
    out = f"run-{extra[-1]}"
    assert main(["rl", "--model", "model", "--mtp", "head", *RL, *extra, "--steps", "2", "--out", out]) == 0
    rows = [json.loads(line) for line in (workdir / out / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
