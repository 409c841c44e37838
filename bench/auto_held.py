"""What an auto call between probes costs: an RL-style chooser's held calls against ``generate`` at the setting it holds.

    PYTHONPATH=. .venv/bin/python bench/auto_held.py --threads 1     # B 1/16, T 1, 400 repeats: ~3 min
    PYTHONPATH=. .venv/bin/python bench/auto_held.py --quick         # B 16, T 1, 5 repeats: ~15 s

Between probes ``generate_auto(probe=False)`` decodes at the held setting as ``generate`` does (the
same steps, tokens and randomness) and adds the chooser's bookkeeping: its acceptance tables decayed
and fed the call's draft positions, the completion lengths kept. At (B, T) a chooser is warmed by an
RL-style run of ``--warm`` calls (a probe, then held calls) and holds its choice (or ``--setting``);
then each repeat runs three arms in an order drawn anew (``rollout.run_order``), sampling seed r in all:
    fixed       ``generate`` at the held setting.
    held        ``generate_auto`` with ``probe=False`` and its own copy of the chooser: an RL-style call
                between probes.
    held after forecast
                the same with another copy, right after that chooser's forecast of a whole call at every
                grid setting (``RlAuto.forecast``: ~2 ms of numpy, not timed): bench/auto.py made it there
                before its RL-style calls until this bench showed what the slot costs (``RlAuto.between``).
Printed per group: each held arm's tok/s over fixed's, the geometric mean of the per-repeat ratios with
its standard error, and pooled; the extra milliseconds a call (mean of the per-repeat differences, with
its standard error). Every repeat's calls must emit the same tokens (checked: a mismatch stops the
bench). The calls' noise is the machine's (~13% a call here): 400 repeats give a ratio's se ~0.6%.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto import GRID, SETTINGS, RlAuto, open_bench, parse_common, round_trip, run_auto, run_groups, save_jsonl  # noqa: E402
from rollout import Method, make_prompts, run_bebop, run_order  # noqa: E402

from bebop.speculative.auto.chooser import config_name  # noqa: E402

ARMS = ["fixed", "held", "held_after_forecast"]
QUICK = {"batch_sizes": [16], "temperatures": [1.0], "repeats": 5, "warm": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16], help="rows B per call")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0], help="T (> 0)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
    ap.add_argument("--repeats", type=int, default=400, help="timed calls per arm and group")
    ap.add_argument("--warm", type=int, default=11, help="RL-style calls before the repeats (a probe every 10)")
    ap.add_argument("--setting", choices=[n for n in GRID if n != "none"], default=None,
                    help="hold this setting (default: the warm run's last choice)")
    ap.add_argument("--out", default=None, help="JSONL, a line per group: every call's seconds and tokens per arm")
    ap.add_argument("--quick", action="store_true", help="B 16, T 1, 5 repeats; overrides those flags")
    return parse_common(ap, argv, QUICK, stat="geometric mean")


def run_group(model, tok, head, batch: int, temperature: float, args) -> dict:
    """The arms at (B, T) -> {"B", "T", "setting", "calls": {arm: [(seconds, tokens), ...]}}."""
    prompts, max_new = make_prompts(batch), args.max_new_tokens
    warm = RlAuto(10)
    for r in range(args.warm):
        warm.call(model, tok, head, prompts, temperature, max_new, seed=10_000 + r)
    held = warm.chooser.held
    if args.setting is not None:
        mode, k = next((m, k) for m, k in SETTINGS if config_name(m, k) == args.setting)
        held = dataclasses.replace(held, mode=mode, speculate_k=k)
    warm.chooser.held = dataclasses.replace(held, confirmed=True)
    setting = config_name(held.mode, held.speculate_k)
    method = Method(held.mode, held.speculate_k)
    runners = {arm: RlAuto(10**9, round_trip(warm.chooser)) for arm in ARMS[1:]}
    calls = {arm: [] for arm in ARMS}

    def call(arm: str, seed: int) -> tuple[float, int]:
        if arm == "fixed":
            seconds, result, _ = run_bebop(model, tok, head, prompts, method, temperature, max_new, seed=seed)
            return seconds, sum(result.lengths)
        runner = runners[arm]
        if arm == "held_after_forecast":
            runner.forecast(batch, max_new)
        seconds, tokens, decision = run_auto(model, tok, head, prompts, temperature, max_new, runner.chooser,
                                             probe=False, seed=seed)
        if decision.probed:
            raise SystemExit(f"error: the {arm} chooser probed at B={batch} T={temperature:g}: it must hold {setting}")
        return seconds, tokens

    run_bebop(model, tok, head, prompts, method, temperature, 4)  # warmup of the fixed setting
    for r in range(args.repeats):
        for arm in run_order(ARMS, r):
            calls[arm].append(call(arm, r))
        tokens = {arm: calls[arm][-1][1] for arm in ARMS}
        if len(set(tokens.values())) > 1:
            raise SystemExit(f"error: repeat {r} at B={batch} T={temperature:g} emitted different tokens {tokens}")
    return {"B": batch, "T": temperature, "setting": setting, "calls": calls}


def compare(group: dict, arm: str) -> dict:
    """``arm`` over fixed: geometric mean of the per-repeat speed ratios (its se), pooled, extra ms a call."""
    fixed, other = (np.array(group["calls"][a], dtype=float) for a in ("fixed", arm))
    log_ratio = np.log(fixed[:, 0] / other[:, 0])  # the same tokens: the speed ratio is the seconds' inverse
    extra = 1e3 * (other[:, 0] - fixed[:, 0])
    n = len(log_ratio)
    return {"geo": float(np.exp(log_ratio.mean())), "geo_se": float(log_ratio.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
            "pooled": float(fixed[:, 0].sum() / other[:, 0].sum()),
            "extra_ms": float(extra.mean()), "extra_se": float(extra.std(ddof=1) / np.sqrt(n)) if n > 1 else 0.0,
            "fixed_ms": float(1e3 * np.median(fixed[:, 0]))}


def format_table(groups: list[dict]) -> str:
    heads = " | ".join(f"{arm.replace('_', ' ')} / fixed (geo ± se) | pooled | extra ms a call" for arm in ARMS[1:])
    lines = [f"| B | T | setting | fixed call ms (median) | {heads} |", "|" + "---|" * (4 + 3 * len(ARMS[1:]))]
    for g in groups:
        cells = []
        for arm in ARMS[1:]:
            c = compare(g, arm)
            cells += [f"{c['geo']:.3f} ± {c['geo_se']:.3f}", f"{c['pooled']:.3f}", f"{c['extra_ms']:.2f} ± {c['extra_se']:.2f}"]
        lines.append(f"| {g['B']} | {g['T']:g} | {g['setting']} | {compare(g, 'held')['fixed_ms']:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, tok, head = open_bench(args, "auto_held.py")
    groups, start = run_groups(args, lambda batch, temperature: run_group(model, tok, head, batch, temperature, args),
                               lambda g: f"held {g['setting']}")
    print("### Held auto calls vs generate at the held setting (same tokens; speed = fixed seconds / arm seconds)\n\n"
          + format_table(groups))
    print(f"\ntotal {time.perf_counter() - start:.0f}s")
    if args.out:
        save_jsonl(args.out, groups)


if __name__ == "__main__":
    main()
