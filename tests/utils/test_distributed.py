"""Data parallelism under torchrun's variables (2 CPU processes, gloo) against one process.

The 2-process runs start ``tests/utils/dp_worker.py`` (or ``python -m bebop``) as two ranks with
RANK/WORLD_SIZE/MASTER_PORT set, as torchrun does; the one-process references run in this process.
"""

from __future__ import annotations

import json
import shutil
import signal
import time

import pytest
import torch

from bebop import cli
from bebop.mtp.head import MtpHead, read_head_files
from bebop.utils import distributed
from bebop.utils.errors import BebopError
from tests.helpers.cli import save_model_dir
from tests.helpers.models import tiny_model
from tests.utils import dp_worker


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A tiny model, 70 training sequences, the 2-process outputs (``ws2``) and the one-process ones (``ws1``)."""
    work = tmp_path_factory.mktemp("dp")
    model = tiny_model("qwen3")
    save_model_dir(work / "model", model)
    MtpHead(model).save_pretrained(work / "head0")  # what eval-mtp evaluates in both runs
    g = torch.Generator().manual_seed(0)
    with open(work / "data.jsonl", "w") as f:
        for _ in range(70):  # NOTE: eval-mtp's batches of 32: three, dealt to the two ranks as 2 + 1
            n = int(torch.randint(8, 14, (1,), generator=g))
            f.write(json.dumps({"token_ids": torch.randint(4, 64, (n,), generator=g).tolist(), "start": 3}) + "\n")
    procs = dp_worker.launch(["tests/utils/dp_worker.py", str(work), "ws2"], world=2)
    assert [p.returncode for p in procs] == [0, 0]
    torch.set_num_threads(1)
    dp_worker.run_all(work, "ws1")
    return work


def test_each_rank_does_its_share(work):
    """The ranks split the work (2 steps x 4 sequences per training run, 70 eval sequences, 7 RL steps x 4
    prompts) in halves."""
    one = json.loads((work / "ws1" / "rows-rank0.json").read_text())
    assert one == {"train_sequences": 8, "eval_sequences": 70, "rollout_prompts": 28}
    ranks = [json.loads((work / "ws2" / f"rows-rank{r}.json").read_text()) for r in (0, 1)]
    # 4 each in the plain run, 4 in the --fsdp run, 4 in its resume to step 4
    assert ranks[0]["train_sequences"] == ranks[1]["train_sequences"] == 4 + 4 + 4
    assert ranks[0]["rollout_prompts"] == ranks[1]["rollout_prompts"] == 14
    assert (ranks[0]["eval_sequences"], ranks[1]["eval_sequences"]) == (32 + 6, 32)  # batches 0 and 2, batch 1
    # --fsdp sharded 2 decoder layers + the head layer's 5 parts (enorm, hnorm, eh_proj, mtp_block, post_norm), twice
    assert ranks[0]["fsdp_modules"] == ranks[1]["fsdp_modules"] == 2 * (2 + 5)


def _head(path):
    return read_head_files(path)[1]


@pytest.mark.parametrize("name", ["head", "head-fsdp"])
def test_train_mtp_two_processes_equal_one(work, name):
    """Same global batch (4 = 2 x 2): the head equals the one-process head (float rounding only), with the
    gradients summed over ranks or the backbone and head sharded by FSDP2."""
    one, two = _head(work / "ws1" / "head"), _head(work / "ws2" / name)
    assert one.keys() == two.keys()
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-5, msg=key)
    rows = [[json.loads(x) for x in (work / tag / "metrics.jsonl").read_text().splitlines()]
            for tag in ("ws1/head", f"ws2/{name}")]
    assert len(rows[1]) == 2  # rank 0 alone wrote: one row per step
    for a, b in zip(*rows):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["alpha_rs"] == pytest.approx(a["alpha_rs"], abs=1e-5)


def test_eval_mtp_two_processes_identical(work):
    one = json.loads((work / "ws1" / "eval.json").read_text())
    two = json.loads((work / "ws2" / "eval.json").read_text())
    assert two == one  # bit for bit: every batch is the same, and the sums are folded in batch order


def test_rl_step_two_processes_equal_one(work):
    """Each rank samples 2 of the 4 prompts: the rollouts are the same tokens, the update the same step."""
    one, two = (torch.load(work / tag / "step.pt", weights_only=False) for tag in ("ws1", "ws2"))
    assert two["token_ids"] == one["token_ids"]
    for key, value in one["policy"].items():
        torch.testing.assert_close(two["policy"][key], value, rtol=0, atol=1e-5, msg=key)
    for key in ("reward_mean", "num_tokens", "spec/num_drafts", "spec/num_accepted_tokens"):
        assert two["row"][key] == pytest.approx(one["row"][key], abs=1e-6), key
    for key in ("rl/loss", "rl/policy_loss", "rl/ratio_mean"):
        assert two["row"][key] == pytest.approx(one["row"][key], abs=1e-5), key


def test_rl_micro_batches_two_processes_equal_one_batch(work):
    """2 ranks x micro-batches of one row, with the online head step: the one-process one-batch step's tokens,
    metrics, policy and head."""
    one, two = (torch.load(work / tag, weights_only=False) for tag in ("ws1/step-online.pt", "ws2/step-micro.pt"))
    assert two["token_ids"] == one["token_ids"]
    for part in ("policy", "head"):
        for key, value in one[part].items():
            torch.testing.assert_close(two[part][key], value, rtol=0, atol=1e-5, msg=f"{part} {key}")
    for key in ("rl/loss", "rl/policy_loss", "rl/ratio_mean", "mtp/loss", "mtp/num_chains"):
        assert two["row"][key] == pytest.approx(one["row"][key], abs=1e-5), key


@pytest.mark.parametrize("run", ["run", "run-async"])
def test_rl_run_two_processes_write_one_run(work, run):
    """One metrics.jsonl, one checkpoint; the same tokens and policy as one process, async rollouts included."""
    run1, run2 = work / "ws1" / run, work / "ws2" / run
    rows = [[json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] for run in (run1, run2)]
    assert len(rows[1]) == 2
    assert [r["num_tokens"] for r in rows[1]] == [r["num_tokens"] for r in rows[0]]
    one = torch.load(run1 / "checkpoint" / "policy.pt", weights_only=True)
    two = torch.load(run2 / "checkpoint" / "policy.pt", weights_only=True)
    for key, value in one.items():
        torch.testing.assert_close(two[key], value, rtol=0, atol=1e-5, msg=key)


@pytest.mark.parametrize("name", ["head", "head-fsdp"])
def test_two_process_checkpoint_resumes_in_one_process(work, tmp_path, name):
    """The 2-process run stopped at step 2; one process continues to step 4 = a one-process 4-step run
    (the FSDP2 run's checkpoint was gathered in full, so it loads without FSDP)."""
    args = ["--model", str(work / "model"), "--data", str(work / "data.jsonl")]
    shutil.copytree(work / "ws2" / name, tmp_path / "resumed")
    assert cli.main(["train-mtp", *args, "--out", str(tmp_path / "resumed"), "--resume", *dp_worker.train_args(4)]) == 0
    straight = _four_steps(work)
    resumed = _head(tmp_path / "resumed")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=1e-5, msg=key)


def test_fsdp_run_resumes_under_fsdp(work):
    """The 2-process FSDP2 run resumed by 2 FSDP2 processes (its optimizer state loaded into the shards)."""
    straight, resumed = _four_steps(work), _head(work / "ws2" / "head-fsdp-4")
    for key in straight:
        torch.testing.assert_close(resumed[key], straight[key], rtol=0, atol=1e-5, msg=key)


def _four_steps(work):
    """The head of a one-process 4-step run (trained once per test session)."""
    out = work / "ws1" / "head-4"
    if not out.is_dir():
        assert cli.main(["train-mtp", "--model", str(work / "model"), "--data", str(work / "data.jsonl"), "--out",
                         str(out), *dp_worker.train_args(4)]) == 0
    return _head(out)


def test_killed_rank_ends_the_other_with_one_line(work, tmp_path):
    """Rank 1 is killed mid-run: rank 0 exits (status 1) within seconds with one ``bebop: error`` line."""
    out = tmp_path / "head"
    argv = ["-m", "bebop", "train-mtp", "--model", str(work / "model"), "--data", str(work / "data.jsonl"),
            "--out", str(out), "--steps", "100000", "--batch-size", "4", "--speculate-k", "2", "--device", "cpu"]
    rank0, rank1 = dp_worker.launch(argv, world=2, env={"BEBOP_DIST_TIMEOUT_S": "60"}, wait=False,
                                    stderr=__import__("subprocess").PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((out / "metrics.jsonl").is_file() and (out / "metrics.jsonl").read_text().count("\n") >= 2):
            assert time.monotonic() < deadline and rank0.poll() is None, "the run never started"
            time.sleep(0.2)
        rank1.send_signal(signal.SIGKILL)
        killed = time.monotonic()
        _, err = rank0.communicate(timeout=90)
        assert time.monotonic() - killed < 90
    finally:
        for p in (rank0, rank1):
            if p.poll() is None:
                p.kill()
    assert rank0.returncode == 1, err
    errors = [line for line in err.splitlines() if line.startswith("bebop: error:")]
    assert len(errors) == 1 and "rank 0 of 2 lost contact with the other ranks" in errors[0], err
    assert "Traceback" not in err


def test_fsdp_needs_several_processes(work, tmp_path, capsys):
    args = ["train-mtp", "--model", str(work / "model"), "--data", str(work / "data.jsonl"), "--out",
            str(tmp_path / "h"), "--fsdp", *dp_worker.TRAIN_ARGS]
    assert cli.main(args) == 2
    assert "bebop: error: --fsdp shards over torchrun's processes" in capsys.readouterr().err
    assert not (tmp_path / "h").exists()


def test_other_commands_refuse_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli.main(["generate", "--num-prompts", "1", "--out", "never-written.jsonl"]) == 2
    assert "bebop: error: `bebop generate` runs as one process; under torchrun only train-mtp, eval-mtp, rl do" in (
        capsys.readouterr().err)


def test_one_process_helpers_are_no_ops():
    assert (distributed.world_size(), distributed.rank(), distributed.is_main()) == (1, 0, True)
    assert distributed.shard_range(5) == (0, 5)
    t = torch.ones(3)
    assert distributed.sum_tensor(t) is t
    assert distributed.gather_objects("x") == ["x"]


def test_bad_timeout_is_one_line(monkeypatch):
    monkeypatch.setenv(distributed.TIMEOUT_ENV, "soon")
    with pytest.raises(BebopError, match="BEBOP_DIST_TIMEOUT_S must be a number of seconds"):
        distributed.timeout_s()
