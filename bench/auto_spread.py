"""RL-style auto's spread over independent choosers: how far one run's ratio to the best is from another's.

    PYTHONPATH=. .venv/bin/python bench/auto_spread.py --threads 1                   # B 16/64 x T 0.3/1, 3 choosers, 30 calls: ~3 min
    PYTHONPATH=. .venv/bin/python bench/auto_spread.py --settings none rs1 rs2 rs3 rs4 --choosers 5

``bench/auto.py`` runs one RL-style chooser per (B, T): its ratio to the best fixed setting is one
draw of a run's outcome (which setting the chooser held for which calls), and it moved 2-5 points
between runs of the same code. Here each (B, T) runs the fixed settings and ``--choosers``
independent RL-style choosers (``bench/auto.py``'s ``RlAuto``: a probing call every ``--auto-every``
calls, a choice from the earlier calls in the others), every one once per repeat in an order
drawn anew for each repeat (``rollout.run_order``), repeat r with sampling seed r everywhere.
Every call's seconds are read at the group's median machine speed (``rollout.Speedometer``: a
canary forward timed after every call), as in ``bench/auto.py``; the raw ratio is printed beside.
Printed per chooser: its tok/s pooled over its calls against the best setting's pooled tok/s, and
the same over the second half of the calls (a longer run's steady state: ``bebop rl`` runs 100
steps by default); its choices alone (the settings' calls of what it chose, pooled, against the
best); its own cost (those calls' seconds over its own); the setting it chose at each call; and its
price errors: after each call from the first re-probe on (call ``--auto-every`` + 1), its step cost
of every depth at B rows (``StepCosts.step_seconds`` x ``scale``) over the
median full-batch step (rows >= 90% of B, the first step left out) of the fixed settings at that
depth in the same group (to and rs share a depth's cost), as the mean log ratio (+: priced dear) of
the depths it did not hold at that call and of the one it held. Then the mean and the smallest ratio
over all choosers, the mean price errors, and the mean per (B, T): compare two versions of the
chooser on their means, not on one run's groups (the same code's 12-chooser mean moved between 0.936
and 0.977 over twelve runs). The price errors say why a chooser holds a setting (a depth priced dear
is not chosen), with less noise than its ratio: one run of 3 + 3 choosers told apart cost models
whose 4-run throughput A/B could not (bench/README.md).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto import SETTINGS, RlAuto, open_bench, parse_common, pooled_tok_s as pooled, side_by_side  # noqa: E402
from rollout import Method, corrected, make_prompts  # noqa: E402

from bebop.config import AUTO_EVERY, AUTO_MAX_K  # noqa: E402
from bebop.speculative.auto.chooser import config_name  # noqa: E402

NAMES = [config_name(m, k) for m, k in SETTINGS]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64], help="rows B per call")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 1.0], help="T (> 0)")
    ap.add_argument("--settings", nargs="+", default=NAMES, choices=NAMES, help="the fixed settings (default: all 9)")
    ap.add_argument("--choosers", type=int, default=3, help="independent RL-style choosers per (B, T)")
    ap.add_argument("--repeats", type=int, default=30, help="calls per setting and per chooser")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
    ap.add_argument("--auto-every", type=int, default=AUTO_EVERY, help="probe every this many calls (bebop rl's default)")
    args = parse_common(ap, argv, stat="pooled")
    if args.choosers < 1 or args.repeats < 1:
        ap.error("--choosers and --repeats must be >= 1")
    return args


def run_group(model, tok, head, batch: int, temperature: float, args) -> list[dict]:
    """The fixed settings and the choosers at (B, T), interleaved -> one summary per chooser."""
    prompts = make_prompts(batch)
    settings = {n: Method(*SETTINGS[NAMES.index(n)]) for n in args.settings}
    choosers = {f"auto{i}": RlAuto(args.auto_every) for i in range(args.choosers)}
    full: dict[int, list[float]] = {}  # depth -> the fixed calls' full-batch step seconds
    prices: dict[str, list[tuple[int, dict[int, float]]]] = {n: [] for n in choosers}  # (held, depth -> B-row price)

    def seen(name: str, result) -> None:
        if result is not None:
            full.setdefault(settings[name].k, []).extend(s for rows, s, _ in result.step_times[1:] if rows >= 0.9 * batch)
        elif choosers[name].calls > args.auto_every:
            rl = choosers[name]
            prices[name].append((rl.decision.speculate_k, price(rl.chooser.costs, batch)))

    timed, canary = side_by_side(model, tok, head, prompts, settings, choosers, temperature, args.max_new_tokens,
                                 args.repeats, seen)
    reference = statistics.median(c for v in canary.values() for c in v)
    calls = {n: corrected(v, canary[n], reference) for n, v in timed.items()}
    best = max(settings, key=lambda n: pooled(calls[n]))
    raw_best = max(settings, key=lambda n: pooled(timed[n]))
    truth = {k: statistics.median(v) for k, v in full.items() if v}
    out = []
    for name, rl in choosers.items():
        chosen = [calls[c][r] if c in settings else None for r, c in enumerate(rl.choices)]
        known = [c for c in chosen if c is not None]  # a choice outside --settings has no fixed call to compare
        own = [calls[name][r] for r, c in enumerate(chosen) if c is not None]
        late = slice(args.repeats // 2, None)  # the second half of the calls: a longer run's steady state
        out.append({"ratio": pooled(calls[name]) / pooled(calls[best]),
                    "raw": pooled(timed[name]) / pooled(timed[raw_best]),
                    "late": pooled(calls[name][late]) / pooled(calls[best][late]),
                    "choices_alone": pooled(known) / pooled(calls[best]) if known else float("nan"),
                    "own": sum(s for s, _ in known) / sum(s for s, _ in own) if known else float("nan"),
                    **price_errors(prices[name], truth), "choices": rl.choices})
    return [{"B": batch, "T": temperature, "best": best, "best_tok_s": pooled(calls[best]), **o} for o in out]


def nanmean(values: list[float]) -> float:
    """The mean of the values that are not nan; nan when none is."""
    known = [v for v in values if v == v]
    return statistics.fmean(known) if known else float("nan")


def price(costs, batch: int) -> dict[int, float]:
    """A chooser's step cost of each depth it can price, at ``batch`` rows (seconds)."""
    steps = {k: costs.step_seconds(k) for k in range(AUTO_MAX_K + 1)}
    return {k: seconds * costs.scale(batch, k) for k, seconds in steps.items() if seconds}


def price_errors(prices: list[tuple[int, dict[int, float]]], truth: dict[int, float]) -> dict[str, float]:
    """Mean log(price / the fixed calls' full-batch step) over a chooser's calls: of the depths it did
    not hold at each call ("price_other") and of the one it held ("price_held"); nan where none."""
    errors: dict[str, list[float]] = {"price_other": [], "price_held": []}
    for held, priced in prices:
        for k, seconds in priced.items():
            if k in truth:
                errors["price_held" if k == held else "price_other"].append(math.log(seconds / truth[k]))
    return {key: nanmean(v) for key, v in errors.items()}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, tok, head = open_bench(args, "auto_spread.py", f"{args.choosers} choosers x {args.repeats} calls")
    print("| B | T | best fixed | best tok/s | chooser | RL-style/best | raw seconds | second half | choices alone/best | "
          "its choices' calls / its calls (seconds) | price error, not held / held | chose, call by call |")
    print("|---:|---:|:---|---:|---:|---:|---:|---:|---:|---:|---:|:---|")
    start, ratios, raws, lates, groups, others, helds = time.perf_counter(), [], [], [], {}, [], []
    for batch in args.batch_sizes:
        for temperature in args.temperatures:
            for i, row in enumerate(run_group(model, tok, head, batch, temperature, args)):
                ratios.append(row["ratio"])
                raws.append(row["raw"])
                lates.append(row["late"])
                others.append(row["price_other"])
                helds.append(row["price_held"])
                groups.setdefault(f"B {batch} T {temperature:g}", []).append(row["ratio"])
                print(f"| {batch} | {temperature:g} | {row['best']} | {row['best_tok_s']:.0f} | {i} | {row['ratio']:.3f} | {row['raw']:.3f} | "
                      f"{row['late']:.3f} | "
                      f"{row['choices_alone']:.3f} | {row['own']:.3f} | {row['price_other']:+.1%} / "
                      f"{row['price_held']:+.1%} | {' '.join(row['choices'])} |", flush=True)
    print(f"\nRL-style/best over {len(ratios)} choosers: mean {statistics.fmean(ratios):.3f}, "
          f"sd {statistics.pstdev(ratios):.3f}, min {min(ratios):.3f}; within 5% in "
          f"{sum(x >= 0.95 for x in ratios)} of {len(ratios)}; over the second half of the calls: mean "
          f"{statistics.fmean(lates):.3f}, min {min(lates):.3f}, within 5% in {sum(x >= 0.95 for x in lates)}")
    print(f"raw seconds (no speed correction): mean {statistics.fmean(raws):.3f}, sd {statistics.pstdev(raws):.3f}, "
          f"min {min(raws):.3f}; within 5% in {sum(x >= 0.95 for x in raws)} of {len(raws)}")
    print(f"price error (mean log ratio to the fixed calls' full-batch step): depths not held {nanmean(others):+.1%}, "
          f"the held depth {nanmean(helds):+.1%}")
    print("mean per group: " + ", ".join(f"{g} {statistics.fmean(r):.3f}" for g, r in groups.items()))
    print(f"\ntotal {time.perf_counter() - start:.0f}s")


if __name__ == "__main__":
    main()
