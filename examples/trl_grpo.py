"""GRPO with TRL's GRPOTrainer on the embedded model, rolling out with Bebop (rs, the cached e2e-TV head).

    python examples/trl_grpo.py --max-steps 20 --output-dir runs/trl-grpo --threads 1
    bebop report runs/trl-grpo                       # writes runs/trl-grpo/report/report.md

The speed-up: run the same steps without MTP (Bebop's engine, plain decoding), then report both runs.

    python examples/trl_grpo.py --max-steps 20 --output-dir runs/trl-none --threads 1 --mode none
    bebop report runs/trl-none runs/trl-grpo --out runs/trl-report

The embedded model and its head are built on first use (a few CPU minutes, cached in ~/.cache/bebop).
TRL's log history (``trainer_state.json``), the rollout's settings (``bebop_rollout.json``) and Bebop's
per-position statistics (``token_stats.jsonl``) are left in the output directory; every step's row
carries ``spec/accept_length`` (null in mode none: nothing is drafted).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL


def build_dataset(num: int, seed: int):
    """Embedded-task problems as TRL rows: ``prompt`` and the ``answer`` column the reward reads."""
    from datasets import Dataset

    from bebop.task import arith

    problems = arith.make_problems(num, seed)
    return Dataset.from_dict({"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]})


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--max-steps", type=int, default=20, help="GRPO steps")
    p.add_argument("--output-dir", default="runs/trl-grpo", help="where TRL writes its state and Bebop its stats")
    p.add_argument("--mode", default="rs", help="Bebop rollout mode: rs | to | none | auto")
    p.add_argument("--speculate-k", default="3", help="K, drafts per verify step, or auto")
    p.add_argument("--prompts-per-step", type=int, default=8, help="distinct prompts per step")
    p.add_argument("--num-generations", type=int, default=8, help="G, completions per prompt")
    p.add_argument("--max-completion-length", type=int, default=48, help="completion tokens, EOS included")
    p.add_argument("--learning-rate", type=float, default=5e-5, help="policy learning rate")
    p.add_argument("--seed", type=int, default=0, help="seeds the problems, TRL and the rollouts")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; on a busy machine 1 can be much faster)")
    return p.parse_args(argv)


def main(argv=None) -> Path:
    """Trains and returns the output directory."""
    from trl import GRPOConfig, GRPOTrainer

    from bebop.embedded import CACHE_DTYPE, ensure_embedded_head
    from bebop.integrations.trl import bebop_rollout_func
    from bebop.models import load_model
    from bebop.task.arith import arith_reward

    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_model(device="cpu", dtype=CACHE_DTYPE)
    head_dir = ensure_embedded_head("e2e_tv", model, tok) if args.mode != "none" else None
    for p in model.parameters():  # load_model freezes the model; GRPO trains all of it
        p.requires_grad_(True)
    k = args.speculate_k if args.speculate_k == "auto" else int(args.speculate_k)
    config = GRPOConfig(
        output_dir=args.output_dir, max_steps=args.max_steps, seed=args.seed, learning_rate=args.learning_rate,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
    )
    trainer = GRPOTrainer(
        model=model, processing_class=tok, reward_funcs=arith_reward, args=config,
        train_dataset=build_dataset(args.max_steps * args.prompts_per_step, args.seed),
        rollout_func=bebop_rollout_func(head_dir, mode=args.mode, speculate_k=k),
    )
    torch.manual_seed(args.seed)
    trainer.train()
    out = Path(args.output_dir)
    trainer.save_state()  # NOTE: with save_strategy="no" TRL writes no trainer_state.json, which bebop report reads
    for r in trainer.state.log_history:
        if "spec/rollout_seconds" in r:
            print(step_line(r))
    print(f"TRL's log history: {out / 'trainer_state.json'}; report: bebop report {out}")
    return out


def step_line(row: dict) -> str:
    """One log-history row as a line; "-" for what the step did not measure (accept length in mode none)."""
    def shown(key: str, fmt: str, unit: str = "") -> str:
        return "-" if row.get(key) is None else format(row[key], fmt) + unit

    return (f"step {row['step']:3d}  reward {shown('reward', '.3f')}"
            f"  accept length {shown('spec/accept_length', '.2f')}  H(p) {shown('spec/target_entropy', '.3f')}"
            f"  rollout {shown('spec/rollout_seconds', '.2f', 's')}  step {shown('step_time', '.2f', 's')}")


if __name__ == "__main__":
    main()
