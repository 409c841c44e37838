"""TRL GRPO step time: TRL's own generation against Bebop's rs rollouts (``bebop_rollout_func``).

    PYTHONPATH=. .venv/bin/python bench/trl_step.py                     # ~5 min on 2 quiet CPU cores
    PYTHONPATH=. .venv/bin/python bench/trl_step.py --steps 4 --repeats 5 --mode rs --speculate-k 3

Defaults: the embedded model and its e2e-TV head (both trained and cached on first use), the
embedded task and its reward, T = 1, ``GRPOConfig`` as in examples/trl_grpo.py.

Terms:
    arm             ``trl``: GRPOTrainer's own generation (transformers ``generate``); ``bebop``:
                    the same trainer with ``rollout_func=bebop_rollout_func(head, mode, K)``.
    step s          TRL's ``step_time`` metric: one optimizer step, generation included.
    rollout s       wall time of ``GRPOTrainer._generate`` (tokenize, sample; Bebop's logprobs
                    forward too), timed around the trainer's own call.
    rollout share   rollout s / step s of the arm.
    ratio           step s of ``trl`` / step s of ``bebop`` within one repeat (above 1: Bebop faster);
                    printed as the mean over repeats +- their standard deviation.

Fairness: both arms start from the same weights, data and seeds; each repeat runs both arms, in
alternating order (trl bebop, bebop trl, ...), so slow phases of a shared machine hit both alike.
The first step of every run is left out (one-time costs). The machine's load average is printed.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time

import torch

from bebop.utils.progress import stage

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--steps", type=int, default=3, help="GRPO steps per run (the first is left out)")
    p.add_argument("--repeats", type=int, default=3, help="runs of each arm, interleaved")
    p.add_argument("--mode", default="rs", help="Bebop's mode: rs | to | none")
    p.add_argument("--speculate-k", type=int, default=3, help="K, drafts per verify step")
    p.add_argument("--prompts-per-step", type=int, default=4, help="distinct prompts per step")
    p.add_argument("--num-generations", type=int, default=8, help="G, completions per prompt")
    p.add_argument("--max-completion-length", type=int, default=48, help="completion tokens, EOS included")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    return p.parse_args(argv)


def timed_generate(trainer, seconds: list[float]) -> None:
    """Wraps the trainer's ``_generate`` (both arms' rollout entry) to record its wall time per call."""
    inner = trainer._generate

    def wrapper(prompts):
        start = time.perf_counter()
        out = inner(prompts)
        seconds.append(time.perf_counter() - start)
        return out

    trainer._generate = wrapper


def run_arm(arm: str, model, tok, head_dir, args, dataset, out_dir: str) -> tuple[list[float], list[float], list]:
    """One run of ``arm`` from a copy of ``model``: (step s, rollout s, accept lengths), warm-up step left out."""
    from trl import GRPOConfig, GRPOTrainer

    from bebop.integrations.trl import bebop_rollout_func
    from bebop.task.arith import arith_reward

    config = GRPOConfig(
        output_dir=out_dir, max_steps=args.steps, seed=0, learning_rate=5e-5,
        per_device_train_batch_size=args.prompts_per_step * args.num_generations,
        num_generations=args.num_generations, max_completion_length=args.max_completion_length,
        temperature=1.0, beta=0.0, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True, bf16=False,
        disable_tqdm=True,
    )
    rollout = (bebop_rollout_func(head_dir, mode=args.mode, speculate_k=args.speculate_k, token_stats=False)
               if arm == "bebop" else None)
    trainer = GRPOTrainer(model=copy.deepcopy(model), processing_class=tok, reward_funcs=arith_reward, args=config,
                          train_dataset=dataset, rollout_func=rollout)
    rollout_s: list[float] = []
    timed_generate(trainer, rollout_s)
    torch.manual_seed(0)
    trainer.train()
    rows = [r for r in trainer.state.log_history if "step_time" in r]
    accept = [r.get("spec/accept_length") for r in rows[1:]]
    return [r["step_time"] for r in rows[1:]], rollout_s[1:], accept


def mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else float("nan")
    return f"{statistics.fmean(values):.3f} +- {sd:.3f}"


def main(argv=None) -> None:
    from datasets import Dataset

    from bebop.embedded import CACHE_DTYPE, ensure_embedded_head
    from bebop.models import load_model
    from bebop.task import arith

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    model, tok = load_model(device="cpu", dtype=CACHE_DTYPE)
    head_dir = ensure_embedded_head("e2e_tv", model, tok)
    for p in model.parameters():
        p.requires_grad_(True)
    problems = arith.make_problems(args.steps * args.prompts_per_step, seed=0)
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]})
    results = {"trl": [], "bebop": []}  # arm -> [(step s, rollout s, accept lengths)] per repeat
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            order = ("trl", "bebop") if r % 2 == 0 else ("bebop", "trl")
            for arm in order:
                with stage(f"bench/trl_step.py: repeat {r + 1}, {arm}"):
                    step_s, rollout_s, accept = run_arm(arm, model, tok, head_dir, args, dataset, tmp)
                results[arm].append((step_s, rollout_s, accept))
                print(f"repeat {r + 1} {arm:5s}  step {statistics.fmean(step_s):.2f}s  "
                      f"rollout {statistics.fmean(rollout_s):.2f}s", flush=True)
    load_end = os.getloadavg()
    print(f"\nB = {args.prompts_per_step} prompts x G = {args.num_generations}, max {args.max_completion_length} "
          f"tokens, T = 1, {args.steps - 1} timed steps x {args.repeats} repeats, "
          f"mode {args.mode} K = {args.speculate_k}")
    for arm, runs in results.items():
        step = [statistics.fmean(s) for s, _, _ in runs]
        rollout = [statistics.fmean(x) for _, x, _ in runs]
        share = [x / s for s, x in zip(step, rollout)]
        accept = [a for _, _, acc in runs for a in acc if a is not None]
        extra = f"  accept length {statistics.fmean(accept):.2f}" if accept else ""
        print(f"{arm:5s}  step {mean_sd(step)} s  rollout {mean_sd(rollout)} s  rollout share {mean_sd(share)}{extra}")
    ratios = [statistics.fmean(t[0]) / statistics.fmean(b[0]) for t, b in zip(results["trl"], results["bebop"])]
    rollout_ratios = [statistics.fmean(t[1]) / statistics.fmean(b[1]) for t, b in zip(results["trl"], results["bebop"])]
    print(f"step time ratio trl/bebop: {mean_sd(ratios)} (over {len(ratios)} repeats)")
    print(f"rollout time ratio trl/bebop: {mean_sd(rollout_ratios)}")
    print(f"load average (1 min) at start {load_start[0]:.1f}, at end {load_end[0]:.1f}; {os.cpu_count()} CPUs, "
          f"{args.threads} torch thread(s)")


if __name__ == "__main__":
    main()
