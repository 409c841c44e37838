"""RL step time and rollout time on the embedded model: Bebop's engine vs vLLM, modes none and rs.

Runs ``train_rl`` (default RL settings: B=8 prompts x G=8, 48 new tokens, cached e2e_tv head) for
each (backend, mode), interleaved (engine/vLLM alternate within every repeat, so machine noise
hits both alike), and prints mean seconds per step of the whole step, its rollout, the policy
update, the head step and the weight sync, and vLLM / engine ratios. The first step of each run is excluded (vLLM
compiles and warms up there; its engine start is not part of any step). Needs vLLM (``.venv-vllm``):

    .venv-vllm/bin/python bench/rl_backends.py --steps 4
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from bebop.utils.progress import stage

KEYS = ("step_s", "rollout_s", "train_s", "mtp_s", "sync_s")


def run_once(backend: str, mode: str, steps: int, seed: int) -> dict[str, list[float]]:
    from bebop import embedded, models
    from bebop.mtp import MtpHead
    from bebop.rl import resolve_rl_config, train_rl

    model, tok = models.load_model()
    head = MtpHead.from_pretrained(embedded.ensure_embedded_head("e2e_tv", model, tok), model)
    cfg = resolve_rl_config(None, {"mode": mode, "steps": steps, "backend": backend, "seed": seed, "save_every": 0})
    with tempfile.TemporaryDirectory() as run_dir:
        rows = train_rl(model, tok, head, cfg, run_dir, show_progress=False)
    return {k: [r[k] for r in rows[1:]] for k in KEYS} | {"tokens": [r["num_tokens"] for r in rows[1:]]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=4, help="RL steps per run, the first excluded (default 4)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved rounds (default 1)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, steps/run {args.steps}")
    runs = [(b, m) for m in ("none", "rs") for b in ("engine", "vllm")]
    times: dict[tuple, dict[str, list[float]]] = {r: {k: [] for k in (*KEYS, "tokens")} for r in runs}
    t0 = time.time()
    for rep in range(args.repeats):
        for run in runs:
            with stage(f"bench/rl_backends.py: repeat {rep + 1}, {run[0]} {run[1]}"):
                for key, values in run_once(*run, args.steps, seed=rep).items():
                    times[run][key] += values
    mean = {r: {k: statistics.mean(v) for k, v in t.items()} for r, t in times.items()}
    print("| backend | mode | step s | rollout s | policy update s | head s | weight sync s | tokens/step | steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (backend, mode), m in mean.items():
        print(f"| {backend} | {mode} | {m['step_s']:.2f} | {m['rollout_s']:.2f} | {m['train_s']:.2f} | "
              f"{m['mtp_s']:.2f} | {m['sync_s']:.2f} | {m['tokens']:.0f} | {len(times[backend, mode]['step_s'])} |")
    for mode in ("none", "rs"):
        e, v = mean["engine", mode], mean["vllm", mode]
        print(f"{mode}: vLLM / engine step time {v['step_s'] / e['step_s']:.3f}, "
              f"rollout time {v['rollout_s'] / e['rollout_s']:.3f}")
    print(f"wall {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
