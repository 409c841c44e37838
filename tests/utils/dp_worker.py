"""The work the data-parallel tests compare: run in W processes (``launch``) and in the test's own process.

``run_all(work, tag)`` trains a head with ``bebop train-mtp`` (2 steps; with several ranks also
with ``--fsdp``, and that run resumed to 4 steps), evaluates the fixed head
``work/head0`` with ``bebop eval-mtp``, takes RL steps (mode rs) through ``rl_step`` and RL runs through
``train_rl``; every output goes under ``work/tag``. Run as a script, it joins the process group
torchrun's variables describe first (``python tests/utils/dp_worker.py WORK TAG``).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
TRAIN_ARGS = ["--loss", "e2e_tv", "--speculate-k", "2", "--batch-size", "4", "--lr", "1e-2", "--steps", "2",
              "--chain-context", "served", "--ce-warmup", "0", "--device", "cpu"]


def train_args(steps: int) -> list[str]:
    """TRAIN_ARGS with ``--steps steps``."""
    at = TRAIN_ARGS.index("--steps") + 1
    return [*TRAIN_ARGS[:at], str(steps), *TRAIN_ARGS[at + 1 :]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], world: int, env: dict | None = None, wait: bool = True, **popen):
    """Starts ``python ARGV`` as ``world`` ranks with torchrun's variables; returns the processes (waited for)."""
    port = free_port()
    procs = []
    for rank in range(world):
        rank_env = {**os.environ, **(env or {}), "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world),
                    "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                    "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, *argv], env=rank_env, cwd=REPO, **popen))
    if wait:
        for p in procs:
            p.wait(timeout=300)
    return procs


def rl_config(**overrides):
    from tests.helpers.rl import tiny_config

    return tiny_config(**{"mode": "rs", "speculate_k": 2, "prompts_per_step": 4, "group_size": 2, "steps": 1,
                          **overrides})


def rl_parts(out: Path) -> None:
    """Three ``rl_step``s (rollout tokens, updated policy and head, metrics to ``out/step.pt``, ``step-online.pt``,
    ``step-micro.pt``) and two 2-step ``train_rl`` runs (``run``, and ``run-async`` with the rollout in a background
    thread)."""
    from bebop.mtp.head import MtpHead
    from bebop.rl.loop import close_state, make_state, rl_step, train_rl
    from bebop.rl.prompts import prompt_batch
    from bebop.utils import distributed
    from bebop.utils.torch_utils import seed_everything
    from tests.helpers.rl import tiny_policy

    # the plain step; the online-head step in one batch and in micro-batches of one row (a budget of 1 token)
    for name, cfg in (("step", rl_config()), ("step-online", rl_config(mtp_update="online")),
                      ("step-micro", rl_config(mtp_update="online", micro_batch_tokens=1))):
        model, tok = tiny_policy()
        seed_everything(cfg.seed)
        head = MtpHead(model)
        state = make_state(model, tok, head, cfg)
        try:
            row, rollout = rl_step(state, prompt_batch(cfg, 0, None), cfg)
        finally:
            close_state(state)
        if distributed.is_main():
            torch.save({"token_ids": rollout.result.token_ids, "policy": model.state_dict(), "head": head.state_dict(),
                        "row": row}, out / f"{name}.pt")
    model, tok = tiny_policy()
    train_rl(model, tok, MtpHead(model), rl_config(steps=2, save_every=1), out / "run", show_progress=False)
    model, tok = tiny_policy()
    train_rl(model, tok, MtpHead(model), rl_config(steps=2, async_rollout=True), out / "run-async", show_progress=False)


def _count_rows(counts: dict, key: str, owner, name: str, rows_of) -> None:
    """Wraps ``owner.name`` so that ``counts[key]`` adds the rows each call handles (``rows_of(args)``)."""
    original = getattr(owner, name)

    def counted(*args, **kwargs):
        counts[key] = counts.get(key, 0) + rows_of(args)
        return original(*args, **kwargs)

    setattr(owner, name, counted)


def run_all(work: Path, tag: str) -> None:
    """Everything above; each rank also writes ``rows-rank<R>.json``: the rows it trained, evaluated and sampled."""
    import json

    from bebop import cli
    from bebop.mtp import evaluate, train
    from bebop.rollout.engine import EngineBackend
    from bebop.utils import distributed

    out = work / tag
    out.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    _count_rows(counts, "train_sequences", train, "chain_loss", lambda a: a[2].shape[0])
    _count_rows(counts, "eval_sequences", evaluate, "_batch_sums", lambda a: len(a[3]))
    _count_rows(counts, "rollout_prompts", EngineBackend, "rollout", lambda a: len(a[1]))
    _count_rows(counts, "fsdp_modules", distributed, "shard", lambda a: 1)
    model, data = str(work / "model"), str(work / "data.jsonl")
    assert cli.main(["train-mtp", "--model", model, "--data", data, "--out", str(out / "head"), *TRAIN_ARGS]) == 0
    if distributed.world_size() > 1:  # the same run with the backbone and head sharded (FSDP2), then resumed
        fsdp = ["train-mtp", "--model", model, "--data", data, "--fsdp"]
        assert cli.main([*fsdp, "--out", str(out / "head-fsdp"), *TRAIN_ARGS]) == 0
        if distributed.is_main():
            shutil.copytree(out / "head-fsdp", out / "head-fsdp-4")
        distributed.barrier()
        assert cli.main([*fsdp, "--out", str(out / "head-fsdp-4"), "--resume", *train_args(steps=4)]) == 0
    assert cli.main(["eval-mtp", "--model", model, "--mtp", str(work / "head0"), "--data", data, "--speculate-k", "2",
                     "--json", str(out / "eval.json"), "--device", "cpu"]) == 0
    rl_parts(out)
    (out / f"rows-rank{distributed.rank()}.json").write_text(json.dumps(counts))


if __name__ == "__main__":
    from bebop.utils import distributed

    torch.set_num_threads(1)
    distributed.init_distributed(torch.device("cpu"))
    run_all(Path(sys.argv[1]), sys.argv[2])
    distributed.close_distributed()
