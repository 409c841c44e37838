"""RL-style auto choosers of two or more kinds side by side with the fixed settings: which kind runs closer to the best.

    PYTHONPATH=. .venv/bin/python bench/auto_ab.py --threads 1                  # B 16/64, T 0.3/1: ~20 min
    PYTHONPATH=. .venv/bin/python bench/auto_ab.py --quick                      # B 16, T 1, 3 calls: ~20 s
    PYTHONPATH=. .venv/bin/python bench/auto_ab.py --batch-sizes 64 --temperatures 0.3 0.7 1 --out ab.jsonl

A change to the chooser is judged here before bench/auto.py's whole grid: its RL-style variant beside
the current one, in the same process and the same (B, T) groups, several choosers of each kind (a
chooser's run turns on a few early decisions, so one chooser per kind says little).
    arms        ``ARMS``: a name -> the ``AutoChooser`` keyword arguments of that kind (``confirm``:
                the current chooser, a changed decision confirmed by a probe in the next call;
                ``hold``: every decision held until the next scheduled probe; ``pooled``: each K's
                alphas from the pooled depths, not replayed where its steps would start; ``fresh``:
                each probe's step costs its own, no ratios pooled over probes, ``CostShape``).
    calls       each chooser runs ``--calls`` calls as ``bench/auto.py``'s RL-style auto (``RlAuto``:
                a probing call every ``--auto-every``); every fixed setting runs the same calls, call r
                with sampling seed r, all in an order drawn anew for each call (``rollout.run_order``).
    ratio       a chooser's pooled tok/s over the best fixed setting's, speed-corrected by the canary
                (``rollout.Speedometer``, as in ``bench/auto.py``); per arm the mean over its choosers.
    alone       the fixed calls of the settings a chooser chose, pooled, over the best's: its choices
                without its probes' cost.
    within 5%   choosers with ratio >= 0.95 (bench/auto.py's bar, per chooser rather than per group).
    price noise over a chooser's probes after its first, the sd of log(a fixed setting's price / the
                best's), mean over the settings (``probe_prices``): how much its probes' prices wander.
    probes chose  the fixed ratio of the settings those probes chose, mean.
The summary gives each arm's mean ratio over all groups and the difference to the first arm with its
standard error over the groups (paired: same group, same calls), and how many calls each arm spent
at each setting. Lines of ``--out`` (JSONL, appended) hold every group's numbers.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto import SETTINGS, RlAuto, open_bench, parse_common, pooled_tok_s, side_by_side  # noqa: E402
from rollout import Method, corrected, make_prompts  # noqa: E402

from bebop.config import AUTO_EVERY  # noqa: E402
from bebop.speculative.auto.chooser import AutoChooser, config_name  # noqa: E402

ARMS = {"confirm": {}, "hold": {"confirm": False}, "pooled": {"replay": False}, "fresh": {"pool_costs": False}}
NAMES = [config_name(m, k) for m, k in SETTINGS]
QUICK = {"batch_sizes": [16], "temperatures": [1.0], "calls": 3, "choosers": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64], help="rows B per call")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 1.0], help="T (> 0)")
    ap.add_argument("--settings", nargs="+", default=["none", "rs1", "rs2", "rs3", "rs4"], choices=NAMES,
                    help="fixed settings timed beside the choosers (the best of them is the reference)")
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="chooser kinds; the first is the baseline")
    ap.add_argument("--choosers", type=int, default=4, help="choosers of each kind per group")
    ap.add_argument("--calls", type=int, default=30, help="calls per chooser and per fixed setting")
    ap.add_argument("--auto-every", type=int, default=AUTO_EVERY, help="a probing call every this many calls")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
    ap.add_argument("--out", default=None, help="append each group's numbers to this JSONL file (with each chooser's choices, probes and forecasts)")
    ap.add_argument("--quick", action="store_true", help="B 16, T 1, 3 calls, 1 chooser per kind")
    args = parse_common(ap, argv, QUICK, stat="pooled")
    args.repeats = args.calls  # read by rollout.header
    return args


def run_group(model, tok, head, batch: int, temperature: float, args) -> dict:
    """The fixed settings and every arm's choosers at (B, T), interleaved -> the group's ratios."""
    prompts = make_prompts(batch)
    fixed = {n: Method(*SETTINGS[NAMES.index(n)]) for n in args.settings}
    choosers = {f"{arm}{i}": RlAuto(args.auto_every, AutoChooser(**ARMS[arm]))
                for arm in args.arms for i in range(args.choosers)}
    timed, canary = side_by_side(model, tok, head, prompts, fixed, choosers, temperature, args.max_new_tokens,
                                 args.calls)
    reference = statistics.median(c for v in canary.values() for c in v)
    calls = {n: corrected(v, canary[n], reference) for n, v in timed.items()}
    best = max(fixed, key=lambda n: pooled_tok_s(calls[n]))
    group = {"B": batch, "T": temperature, "best": best,
             "fixed": {n: pooled_tok_s(calls[n]) / pooled_tok_s(calls[best]) for n in fixed}, "choosers": {}}
    for name, rl in choosers.items():
        chosen = [calls[c][r] for r, c in enumerate(rl.choices) if c in fixed]
        noise, quality = probe_prices(rl.probes, group["fixed"], best)
        group["choosers"][name] = {
            "arm": name.rstrip("0123456789"), "ratio": pooled_tok_s(calls[name]) / pooled_tok_s(calls[best]),
            "alone": pooled_tok_s(chosen) / pooled_tok_s(calls[best]) if len(chosen) == len(rl.choices) else None,
            "price_noise": noise, "probe_quality": quality,
            "choices": rl.choices, "probes": rl.probes,  # NOTE: each probe's prices, to read a lock-in's cause
            "forecasts": [f["new"] for f in rl.forecasts]}
    return group


def probe_prices(probes: list[dict], fixed: dict[str, float], best: str) -> tuple[float | None, float | None]:
    """(noise, quality) of a chooser's probes after its first: the sd over them of log(a fixed setting's
    price / the best's), mean over the other fixed settings (None under two probes); and the fixed
    calls' ratio of the settings they chose, mean."""
    later = probes[1:]
    if not later:
        return None, None
    quality = statistics.fmean(fixed.get(p["chose"], 0.0) for p in later)
    if len(later) < 2:
        return None, quality
    spreads = [statistics.stdev(math.log(p["predictions"][n] / p["predictions"][best]) for p in later)
               for n in fixed if n != best and all(p["predictions"].get(n, 0) > 0 for p in later)]
    return (statistics.fmean(spreads) if spreads else None), quality


def arm_mean(group: dict, arm: str, key: str = "ratio") -> float:
    values = [c[key] for c in group["choosers"].values() if c["arm"] == arm and c[key] is not None]
    return statistics.fmean(values) if values else float("nan")


def format_group(group: dict, arms: list[str]) -> str:
    lines = [f"B={group['B']} T={group['T']}: best {group['best']}; fixed " +
             " ".join(f"{n} {r:.3f}" for n, r in group["fixed"].items())]
    for arm in arms:
        lines.append(f"  {arm:<8} ratio {arm_mean(group, arm):.3f}  alone {arm_mean(group, arm, 'alone'):.3f}  "
                     f"price noise {arm_mean(group, arm, 'price_noise'):.3f}  "
                     f"probes chose {arm_mean(group, arm, 'probe_quality'):.3f}")
        for name, c in group["choosers"].items():
            if c["arm"] == arm:
                lines.append(f"    {name:<10} {c['ratio']:.3f}  {' '.join(c['choices'])}")
    return "\n".join(lines)


def summary(groups: list[dict], arms: list[str]) -> str:
    base = arms[0]
    lines = [f"summary over {len(groups)} groups (ratio to the best fixed setting, speed-corrected):"]
    for arm in arms:
        ratios = [c["ratio"] for g in groups for c in g["choosers"].values() if c["arm"] == arm]
        spent = collections.Counter(x for g in groups for c in g["choosers"].values() if c["arm"] == arm
                                    for x in c["choices"])
        line = (f"  {arm:<8} mean {statistics.fmean(arm_mean(g, arm) for g in groups):.4f}  within 5% "
                f"{sum(r >= 0.95 for r in ratios)} of {len(ratios)}  price noise "
                f"{statistics.median(arm_mean(g, arm, 'price_noise') for g in groups):.3f} (median)  probes chose "
                f"{statistics.fmean(arm_mean(g, arm, 'probe_quality') for g in groups):.3f}  calls " +
                " ".join(f"{n} {spent[n]}" for n in NAMES if spent[n]))
        if arm != base:
            diffs = [100 * (arm_mean(g, arm) - arm_mean(g, base)) for g in groups]
            se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
            line += (f"\n           vs {base}: {statistics.fmean(diffs):+.2f} points (se {se:.2f}), "
                     f"ahead in {sum(d > 0 for d in diffs)} of {len(diffs)} groups")
        lines.append(line)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, tok, head = open_bench(args, "auto_ab.py", f"arms {' '.join(args.arms)} x {args.choosers}")
    groups = []
    for batch in args.batch_sizes:
        for temperature in args.temperatures:
            start = time.perf_counter()
            group = run_group(model, tok, head, batch, temperature, args)
            groups.append(group)
            print(format_group(group, args.arms) + f"\n  ({time.perf_counter() - start:.0f} s)", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(group) + "\n")
    print(summary(groups, args.arms), flush=True)


if __name__ == "__main__":
    main()
