"""Automatic mode/K (``bebop.spec.auto``) against the best fixed setting found by grid search, same run.

    PYTHONPATH=. .venv/bin/python bench/auto.py --threads 1     # T 0.3/0.7/1, B 1/16/64, 5 repeats: ~5-10 min
    PYTHONPATH=. .venv/bin/python bench/auto.py --quick         # B 16, T 1, 3 repeats: ~30 s

Defaults: the embedded model and its e2e-TV head (both trained and cached on first use), the
embedded task's prompts, 48 new tokens.

At each (B, T) every setting runs once per repeat, in alternating order (A B C, C B A, ...), so a
noisy phase of the machine hits all of them alike; tok/s are medians of the repeats:
    grid        none, to and rs at K = 1..4 (9 fixed settings).
    auto        ``generate_auto`` with mode and K auto and a fresh ``AutoChooser`` per call, as
                ``bebop generate --mode auto --speculate-k auto`` runs: its probe chunks are part of
                its time.
Columns:
    best        the grid's fastest setting and its tok/s.
    auto/best   auto's tok/s over the best's (the target: >= 0.95).
    chosen      the setting auto picked (the most frequent over the repeats, and how often).
    chosen/best the grid tok/s of the chosen setting over the best's: the choice alone, without the
                probes' cost.
    pred. error predicted / measured - 1 for every grid setting, the prediction being that of the
                auto calls' model at the decision (median over repeats), scaled to B rows; the
                median of |error| over the 9 settings, and the chosen setting's own error.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import Method, header, load, make_prompts, run_bebop, warn_if_busy  # noqa: E402

from bebop.spec import SamplingParams, SpecConfig  # noqa: E402
from bebop.spec.auto import AUTO, candidates, config_name, generate_auto  # noqa: E402

SETTINGS = candidates(SpecConfig(AUTO, AUTO))  # none, to1..4, rs1..4
SAMPLING_SEED = 0  # the same rows' randomness every repeat
QUICK = {"batch_sizes": [16], "temperatures": [1.0], "repeats": 3}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="HF model directory (default: the embedded model)")
    ap.add_argument("--mtp", default=None, help="MTP head directory (default: the embedded e2e_tv head)")
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="rows B per call")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7, 1.0], help="T (> 0)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per setting")
    ap.add_argument("--quick", action="store_true", help="B 16, T 1, 3 repeats; overrides those flags")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--stat", default="median", help=argparse.SUPPRESS)  # read by rollout.header
    args = ap.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    return args


def run_auto(model, tok, head, prompts, temperature: float, max_new: int):
    """One ``generate_auto`` call -> (seconds, tokens, decision)."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new)
    start = time.perf_counter()
    result, decision = generate_auto(model, tok, prompts, mtp=head, sampling=sampling, seed=SAMPLING_SEED)
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, sum(result.lengths), decision


def run_group(model, tok, head, batch: int, temperature: float, args) -> dict:
    """Every grid setting and auto at (B, T), interleaved; medians and auto's decisions."""
    prompts = make_prompts(batch)
    names = [config_name(m, k) for m, k in SETTINGS] + ["auto"]
    rates: dict[str, list[float]] = {n: [] for n in names}
    decisions = []

    def call(name: str, max_new: int) -> float:
        if name == "auto":
            seconds, tokens, decision = run_auto(model, tok, head, prompts, temperature, max_new)
            decisions.append(decision)
            return tokens / seconds
        mode, k = next((m, k) for m, k in SETTINGS if config_name(m, k) == name)
        seconds, result, _ = run_bebop(model, tok, head, prompts, Method(mode, k), temperature, max_new)
        return sum(result.lengths) / seconds

    for name in names:
        call(name, 4)  # warmup
    decisions.clear()
    for r in range(args.repeats):
        for name in names if r % 2 == 0 else names[::-1]:
            rates[name].append(call(name, args.max_new_tokens))
    tok_s = {n: statistics.median(v) for n, v in rates.items()}
    predicted = {n: statistics.median(d.predictions[n] * batch / d.rows for d in decisions) for n in names[:-1]}
    chosen, count = collections.Counter(config_name(d.mode, d.speculate_k) for d in decisions).most_common(1)[0]
    return {"B": batch, "T": temperature, "tok_s": tok_s, "predicted": predicted, "chosen": chosen,
            "chosen_count": count, "decisions": [config_name(d.mode, d.speculate_k) for d in decisions]}


def format_table(groups: list[dict], repeats: int) -> str:
    lines = ["| B | T | best fixed | best tok/s | auto tok/s | auto/best | chosen (of %d) | chosen/best | "
             "pred. error, median over settings | pred. error, chosen |" % repeats,
             "|---:|---:|:---|---:|---:|---:|:---|---:|---:|---:|"]
    for g in groups:
        grid = {n: v for n, v in g["tok_s"].items() if n != "auto"}
        best = max(grid, key=grid.get)
        errors = {n: g["predicted"][n] / grid[n] - 1 for n in grid}
        lines.append(
            f"| {g['B']} | {g['T']:g} | {best} | {grid[best]:.0f} | {g['tok_s']['auto']:.0f} | "
            f"{g['tok_s']['auto'] / grid[best]:.2f} | {g['chosen']} ({g['chosen_count']}) | "
            f"{grid[g['chosen']] / grid[best]:.2f} | {statistics.median(abs(e) for e in errors.values()):.0%} | "
            f"{errors[g['chosen']]:+.0%} |")
    return "\n".join(lines)


def format_grid(groups: list[dict]) -> str:
    names = [config_name(m, k) for m, k in SETTINGS]
    lines = ["| B | T | " + " | ".join(names) + " | auto |", "|---:|---:|" + "---:|" * (len(names) + 1)]
    for g in groups:
        cells = [f"{g['tok_s'][n]:.0f} ({g['predicted'][n]:.0f})" for n in names]
        lines.append(f"| {g['B']} | {g['T']:g} | " + " | ".join(cells) + f" | {g['tok_s']['auto']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, head = load(args)
    print(f"# bench/auto.py | {header(args, model, head, next(model.parameters()).device)}\n", flush=True)
    warn_if_busy()
    start, groups = time.perf_counter(), []
    for batch in args.batch_sizes:
        for temperature in args.temperatures:
            groups.append(run_group(model, tok, head, batch, temperature, args))
            print(f"[{time.perf_counter() - start:.0f}s] done B={batch} T={temperature:g}: auto chose "
                  f"{groups[-1]['decisions']}", file=sys.stderr, flush=True)
    ratios = [g["tok_s"]["auto"] / max(v for n, v in g["tok_s"].items() if n != "auto") for g in groups]
    print("### auto vs the best fixed setting (tok/s, medians)\n\n" + format_table(groups, args.repeats))
    print(f"\nauto/best: median {statistics.median(ratios):.2f}, min {min(ratios):.2f}; within 5% in "
          f"{sum(r >= 0.95 for r in ratios)} of {len(ratios)} groups")
    print("\n### Every setting: measured tok/s (predicted by auto's model at the decision)\n\n" + format_grid(groups))
    print(f"\ntotal {time.perf_counter() - start:.0f}s, load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
