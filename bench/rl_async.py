"""Does ``--async-rollout`` help on this machine? Sync vs async RL steps, side by side in one run.

Runs the same RL configuration (embedded model, rs + the cached e2e_tv head) with and without
the background rollout thread, alternating A/B/A/B so machine noise hits both alike, and prints
mean step seconds and the ratio. The first step of each run is excluded (the async pipeline
fills there).

    python bench/rl_async.py --steps 6 --repeats 2
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from bebop.utils.progress import stage


def run_once(async_rollout: bool, steps: int, seed: int) -> list[float]:
    from bebop import embedded, models
    from bebop.mtp import MtpHead
    from bebop.rl import resolve_rl_config, train_rl

    model, tok = models.load_model()
    head = MtpHead.from_pretrained(embedded.ensure_embedded_head("e2e_tv", model, tok), model)
    cfg = resolve_rl_config(None, {"mode": "rs", "steps": steps, "async_rollout": async_rollout, "seed": seed,
                                   "save_every": 0})
    with tempfile.TemporaryDirectory() as run_dir:
        rows = train_rl(model, tok, head, cfg, run_dir, show_progress=False)
    return [r["step_s"] for r in rows[1:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--steps", type=int, default=6, help="RL steps per run (default 6)")
    parser.add_argument("--repeats", type=int, default=2, help="A/B pairs (default 2)")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, steps/run {args.steps}")
    times: dict[bool, list[float]] = {False: [], True: []}
    t0 = time.time()
    for rep in range(args.repeats):
        for mode in (False, True):
            with stage(f"bench/rl_async.py: repeat {rep + 1}, {'async' if mode else 'sync'}"):
                times[mode] += run_once(mode, args.steps, seed=rep)
    sync, asyn = statistics.mean(times[False]), statistics.mean(times[True])
    print("| rollout | mean step s | steps measured |\n|---|---|---|")
    print(f"| sync | {sync:.3f} | {len(times[False])} |\n| async | {asyn:.3f} | {len(times[True])} |")
    print(f"async / sync step time: {asyn / sync:.3f} (below 1 means async helps); wall {time.time() - t0:.0f}s")


if __name__ == "__main__":
    main()
