"""Automatic mode/K against fixed settings in one run: ``grid`` measures the bar, ``ab`` compares choosers.

    PYTHONPATH=. .venv/bin/python -m bench.auto grid --threads 1     # T 0.3/0.7/1, B 1/16/64, 80 repeats (160 at B = 1)
    PYTHONPATH=. .venv/bin/python -m bench.auto grid --quick         # B 16, T 1, 3 repeats (grid: also with no subcommand)
    PYTHONPATH=. .venv/bin/python -m bench.auto ab --threads 1       # confirm vs hold, B 16/64 x T 0.3/1, 4 choosers a kind
    PYTHONPATH=. .venv/bin/python -m bench.auto ab --quick

Defaults: the embedded model and its e2e-TV head (both trained and cached on first use), the
embedded task's prompts, 48 new tokens.

grid: at each (B, T) every setting runs once per repeat, in an order drawn anew for each repeat
(``bench.rollout.run_order``), repeat r with sampling seed r in every setting; tok/s are medians of
the repeats. Speed-corrected: a canary forward of the model is timed after every call
(``bench.rollout.Speedometer``) and each call's seconds are read at the group's median canary speed;
the tables come twice, corrected first, then on raw seconds.
    grid        none, to and rs at K = 1..4 (9 fixed settings).
    one-shot    ``generate_auto`` with a fresh chooser per call, as ``bebop generate --mode auto
                --speculate-k auto --auto-profile none`` runs (a model's first call).
    RL-style    one ``AutoChooser`` across the group's calls, as ``bebop rl`` keeps it (its probe
                schedule: every ``--auto-every`` calls and to confirm a first choice); tok/s pooled
                over its calls, against the best setting's pooled tok/s.
    profiled    ``bebop generate`` with an auto profile: each call starts from the chooser the
                previous call saved (its JSON state read back); pooled like RL-style.
    oracle      a control: each repeat the fixed setting with the best pooled tok/s of the grid's
                calls so far, at no cost of its own: its ratio to the best is the bar's floor at
                this run's noise (the best of 9 noisy estimates is read high).
Columns: the best setting and its tok/s; each auto's ratio to the best with a 90% bootstrap interval
(the repeats resampled, the best re-picked in each); one-shot's most frequent choice; "its choice":
an auto's calls over the grid's call of the setting it chose, same repeat (its own cost); noise, the
best setting's sd / median. The summary says whether the run met the bar, RL-style and profiled each
within 5% of the best (>= 0.95) in every (B, T), and in what share of bootstrap resamples; then the
oracle, RL-style and profiled over the oracle, and RL-style's choices alone. Prediction error,
predicted / measured - 1: one-shot's prediction of the rest of its call at its choice.

ab: fixed settings (``--settings``) and ``--choosers`` RL-style choosers of each kind (``ARMS``: ``AutoChooser``
keyword arguments) over ``--calls`` calls, as grid's RL-style; per arm the mean ratio to the best
fixed setting (speed-corrected), its choices alone, the probes' price noise (sd over a chooser's
probes of log(a setting's price / the best's)), and the difference to the first arm with its
standard error over the groups (paired: same group, same calls).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import statistics
import sys
import time

import numpy as np

from bebop.config import AUTO_EVERY
from bebop.speculative.auto.chooser import AutoChooser, config_name
from bebop.utils.progress import stage
from bench.harness import (GRID, SETTINGS, ProfiledAuto, RlAuto, add_common, open_bench, pooled_tok_s, run_auto,
                           run_groups, save_jsonl, side_by_side)
from bench.rollout import Method, Speedometer, corrected, make_prompts, run_bebop, run_order

QUICK = {"batch_sizes": [16], "temperatures": [1.0], "repeats": 3}
# NOTE: a B = 1 call's tok/s varies far more from draw to draw (one row's acceptance) than a batch's: below
# SMALL_BATCH rows a group runs SMALL_BATCH // B times the repeats, at most SMALL_BATCH_MAX times.
SMALL_BATCH, SMALL_BATCH_MAX = 16, 2
BOOTSTRAP = 2000  # resamples of the repeats behind each 90% interval
ARMS = {"confirm": {}, "hold": {"confirm": False}}  # ab's chooser kinds: AutoChooser keyword arguments
AB_QUICK = {"batch_sizes": [16], "temperatures": [1.0], "calls": 3, "choosers": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    sub = ap.add_subparsers(dest="command", required=True)
    grid = sub.add_parser("grid", help="auto against the best fixed setting: the bar", allow_abbrev=False)
    grid.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="rows B per call")
    grid.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7, 1.0], help="T (> 0)")
    grid.add_argument("--repeats", type=int, default=80, help="timed calls per setting (more below 16 rows)")
    grid.add_argument("--out", default=None, help="JSONL, a line per group: every call's seconds and tokens, raw "
                                                  "and speed-corrected, the canary, each chooser's choices")
    grid.set_defaults(stat="median", quick_values=QUICK)
    ab = sub.add_parser("ab", help="RL-style choosers of several kinds side by side with fixed settings",
                        allow_abbrev=False)
    ab.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64], help="rows B per call")
    ab.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 1.0], help="T (> 0)")
    ab.add_argument("--settings", nargs="+", default=["none", "rs1", "rs2", "rs3", "rs4"], choices=GRID,
                    help="fixed settings timed beside the choosers (the best of them is the reference)")
    ab.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS), help="chooser kinds; the first is the baseline")
    ab.add_argument("--choosers", type=int, default=4, help="choosers of each kind per group")
    ab.add_argument("--calls", type=int, default=30, help="calls per chooser and per fixed setting")
    ab.add_argument("--out", default=None, help="append each group's numbers to this JSONL file")
    ab.set_defaults(stat="pooled", quick_values=AB_QUICK)
    for p in (grid, ab):
        p.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
        p.add_argument("--auto-every", type=int, default=AUTO_EVERY, help="RL-style: probe every this many calls")
        p.add_argument("--quick", action="store_true", help="a small run: B 16, T 1, a few calls")
        add_common(p)
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in ("grid", "ab", "-h", "--help"):
        argv = ["grid", *argv]  # NOTE: no subcommand is grid
    args = ap.parse_args(argv)
    if args.quick:
        vars(args).update(args.quick_values)
    if args.command == "ab":
        args.repeats = args.calls  # read by bench.rollout.header
    return args


def run_group(model, tok, head, batch: int, temperature: float, args) -> dict:
    """Every grid setting, one-shot, profiled and RL-style auto at (B, T), interleaved -> the group's
    calls, raw (``timed``) and at the machine's reference speed (the speed-corrected view, ``timing``)."""
    prompts = make_prompts(batch)
    names = GRID + ["auto", "auto_profiled", "auto_rl", "oracle"]
    calls: dict[str, list[tuple[float, int]]] = {n: [] for n in names}  # (seconds, tokens) per repeat
    canary: dict[str, list[float]] = {n: [] for n in names}  # the canary around each call (``Speedometer``)
    decisions, rl, profiled, oracle = [], RlAuto(args.auto_every), ProfiledAuto(), []

    def call(name: str, max_new: int, seed: int = 0) -> tuple[float, int]:
        if name == "auto":
            seconds, tokens, decision = run_auto(model, tok, head, prompts, temperature, max_new, seed=seed)
            decisions.append(decision)
            return seconds, tokens
        if name == "auto_rl":
            return rl.call(model, tok, head, prompts, temperature, max_new, seed)
        if name == "auto_profiled":
            return profiled.call(model, tok, head, prompts, temperature, max_new, seed)
        if name == "oracle":  # the grid's best so far: its calls of this group, raw seconds
            ran = [n for n in GRID if calls[n]]
            oracle.append(max(ran, key=lambda n: pooled_tok_s(calls[n])) if ran else GRID[0])
            name = oracle[-1]
        mode, k = next((m, k) for m, k in SETTINGS if config_name(m, k) == name)
        seconds, result, _ = run_bebop(model, tok, head, prompts, Method(mode, k), temperature, max_new, seed=seed)
        return seconds, sum(result.lengths)

    for name in GRID + ["auto"]:
        call(name, 4)  # warmup (RL-style and profiled auto run the same code as auto, the oracle as the grid)
    decisions.clear()
    speed = Speedometer(model)
    for r in range(repeats_at(batch, args.repeats)):
        for name in run_order(names, r):
            calls[name].append(call(name, args.max_new_tokens, seed=r))
            canary[name].append(speed.around())
            if name == "auto_profiled":
                profiled.between()
    reference = statistics.median(c for v in canary.values() for c in v)
    chosen, count = collections.Counter(config_name(d.mode, d.speculate_k) for d in decisions).most_common(1)[0]
    group = {"B": batch, "T": temperature, "canary": reference,
             "chosen": chosen, "chosen_count": count, "decisions": [config_name(d.mode, d.speculate_k) for d in decisions],
             "rest_error": statistics.median([d.predicted_tok_s / d.measured_tok_s - 1 for d in decisions
                                              if d.measured_tok_s > 0] or [float("nan")]),  # nan: ended in the probe
             "rl_chosen": config_name(rl.decision.mode, rl.decision.speculate_k), "rl_choices": rl.choices,
             "profiled_choices": profiled.choices, "oracle_choices": oracle}
    timed = timing(group, calls)
    return {**timing(group, {n: corrected(v, canary[n], reference) for n, v in calls.items()}), "timed": timed}


def timing(group: dict, calls: dict[str, list[tuple[float, int]]]) -> dict:
    """``group`` with the tok/s its (seconds, tokens) ``calls`` give: medians (``tok_s``), pooled, per
    repeat (``rates``), one-shot's and RL-style's own cost and RL-style's choices alone."""
    rates = {n: [t / s for s, t in v] for n, v in calls.items()}
    # an auto's calls against the grid's call of the setting each chose, same repeat (same seed): its own cost
    own = {name: statistics.median(rate / rates[choice][r] for r, (rate, choice) in enumerate(zip(rates[name], chose)))
           for name, chose in (("auto_rl", group["rl_choices"]), ("auto", group["decisions"]))}
    # the grid's calls of the settings RL-style chose, same repeats, pooled: its choices without its own cost
    chosen_calls = [calls[choice][r] for r, choice in enumerate(group["rl_choices"])]
    return {**group, "calls": calls, "rates": rates, "tok_s": {n: statistics.median(v) for n, v in rates.items()},
            "pooled": {n: pooled_tok_s(v) for n, v in calls.items()},
            "rl_own": own["auto_rl"], "auto_own": own["auto"], "rl_choices_tok_s": pooled_tok_s(chosen_calls)}


def _grid(g: dict, key: str = "tok_s") -> dict:
    return {n: g[key][n] for n in GRID}


def interval(g: dict, name: str, against: str | None = None) -> tuple[float, float]:
    """90% bootstrap interval of ``name``'s ratio to the best fixed setting (or to ``against``)."""
    ratio = resampled(g, name, against)
    return float(np.quantile(ratio, 0.05)), float(np.quantile(ratio, 0.95))


def resampled(g: dict, name: str, against: str | None = None, resamples: int = BOOTSTRAP) -> np.ndarray:
    """``name``'s ratio to the best fixed setting (or to ``against``) in each of ``resamples`` bootstrap
    resamples: the repeats drawn with replacement (the same indices for every setting, as they ran
    side by side, and for every ``name``: the draws are seeded), the best re-picked in each. One-shot
    auto: medians; the others: pooled tokens / seconds. The RL-style chooser's calls are treated as
    independent, which they are not quite (it learns across them)."""
    names = ([against] if against else GRID) + [name]
    rates = np.array([g["rates"][n] for n in names])  # (settings, repeats)
    seconds = np.array([[c[0] for c in g["calls"][n]] for n in names])
    tokens = np.array([[c[1] for c in g["calls"][n]] for n in names])
    idx = np.random.default_rng(0).integers(0, rates.shape[1], (resamples, rates.shape[1]))  # (S, repeats)
    if name == "auto":
        stat = np.median(rates[:, idx], axis=-1)  # (settings, S)
    else:
        stat = tokens[:, idx].sum(-1) / seconds[:, idx].sum(-1)
    return stat[-1] / stat[:-1].max(0)


def pass_rate(groups: list[dict], names: tuple[str, ...]) -> float:
    """The share of bootstrap resamples in which every one of ``names`` is within 5% of the best in
    every group (groups resampled independently, the names of a group together): how firmly the run's
    repeats carry its verdict."""
    return float(np.prod([np.mean(np.all([resampled(g, n) >= 0.95 for n in names], axis=0)) for g in groups]))


def held_out(g: dict, name: str) -> float:
    """``name``'s ratio to the best fixed setting picked on the other half of the repeats (even / odd
    repeats, both ways, the two ratios averaged): the best of 9 noisy medians measures high on the
    repeats that picked it (the winner's curse); on the other half it measures what picking it gives."""
    ratios = []
    for half in (0, 1):
        pick, test = ([r for r in range(len(g["rates"][name])) if r % 2 == h] for h in (half, 1 - half))
        best = max(GRID, key=lambda n: _stat(g, n, pick, name))
        ratios.append(_stat(g, name, test, name) / _stat(g, best, test, name))
    return statistics.fmean(ratios)


def _stat(g: dict, setting: str, repeats: list[int], kind: str) -> float:
    """The tok/s of ``setting`` over some repeats as the ratio for ``kind`` reads it: medians for
    one-shot auto, pooled tokens / seconds for RL-style."""
    if kind == "auto":
        return statistics.median(g["rates"][setting][r] for r in repeats)
    return pooled_tok_s([g["calls"][setting][r] for r in repeats])


def noise(g: dict) -> float:
    """Spread of the best fixed setting's repeats: standard deviation / median."""
    grid = _grid(g)
    runs = g["rates"][max(grid, key=grid.get)]
    return statistics.stdev(runs) / statistics.median(runs) if len(runs) > 1 else float("nan")


def repeats_at(batch: int, repeats: int) -> int:
    """Repeats of a group of ``batch`` rows: ``repeats``, times SMALL_BATCH // batch (at most
    SMALL_BATCH_MAX) below SMALL_BATCH rows."""
    return repeats * min(SMALL_BATCH_MAX, max(1, SMALL_BATCH // batch))


def format_table(groups: list[dict]) -> str:
    lines = ["| B | T | repeats | best fixed | best tok/s | one-shot tok/s | one-shot/best [90%] | one-shot chose (times) | "
             "chosen/best | one-shot/its choice | profiled auto/best (pooled) [90%] | RL-style auto/best (pooled) [90%] | RL-style chose | "
             "RL-style/its choice | oracle/best (pooled) [90%] | noise (best's sd/median) |",
             "|---:|---:|---:|:---|---:|---:|---:|:---|---:|---:|---:|---:|:---|---:|---:|---:|"]
    for g in groups:
        grid, pooled = _grid(g), _grid(g, "pooled")
        best, best_pooled = max(grid, key=grid.get), max(pooled.values())
        (lo, hi), (rl_lo, rl_hi), (pr_lo, pr_hi), (or_lo, or_hi) = (interval(g, n) for n in ("auto", "auto_rl", "auto_profiled", "oracle"))
        lines.append(
            f"| {g['B']} | {g['T']:g} | {len(g['decisions'])} | {best} | {grid[best]:.0f} | {g['tok_s']['auto']:.0f} | "
            f"{g['tok_s']['auto'] / grid[best]:.2f} [{lo:.2f}, {hi:.2f}] | {g['chosen']} ({g['chosen_count']}) | "
            f"{grid[g['chosen']] / grid[best]:.2f} | {g['auto_own']:.2f} | {g['pooled']['auto_profiled'] / best_pooled:.2f} "
            f"[{pr_lo:.2f}, {pr_hi:.2f}] | {g['pooled']['auto_rl'] / best_pooled:.2f} "
            f"[{rl_lo:.2f}, {rl_hi:.2f}] | {g['rl_chosen']} | {g['rl_own']:.2f} | {g['pooled']['oracle'] / best_pooled:.2f} "
            f"[{or_lo:.2f}, {or_hi:.2f}] | {noise(g):.0%} |")
    return "\n".join(lines)


def format_errors(groups: list[dict]) -> str:
    lines = ["| B | T | one-shot, chosen, rest of call (median) |", "|---:|---:|---:|"]
    lines += [f"| {g['B']} | {g['T']:g} | {g['rest_error']:+.0%} |" for g in groups]
    return "\n".join(lines)


def format_grid(groups: list[dict]) -> str:
    names = [config_name(m, k) for m, k in SETTINGS]
    lines = ["| B | T | " + " | ".join(names) + " | one-shot auto | profiled auto | RL-style auto |",
             "|---:|---:|" + "---:|" * (len(names) + 3)]
    for g in groups:
        cells = [f"{g['tok_s'][n]:.0f}" for n in names]
        lines.append(f"| {g['B']} | {g['T']:g} | " + " | ".join(cells) +
                     f" | {g['tok_s']['auto']:.0f} | {g['tok_s']['auto_profiled']:.0f} | {g['tok_s']['auto_rl']:.0f} |")
    return "\n".join(lines)


def _ratio(g: dict, name: str) -> float:
    """An auto's tok/s over the best fixed setting's: medians for one-shot, pooled for the others."""
    if name == "auto":
        return g["tok_s"]["auto"] / max(_grid(g).values())
    return g["pooled"][name] / max(_grid(g, "pooled").values())


def summary(groups: list[dict], auto_every: int) -> str:
    """The ratios to the best over the groups: how many within 5%, held out, RL-style's choices alone, noise."""
    lines, within = [], {}
    for label, name in (("auto (one-shot)/best", "auto"), (f"auto (profiled generate, every {AUTO_EVERY})/best", "auto_profiled"),
                        (f"auto (RL-style, every {auto_every})/best", "auto_rl")):
        r = [_ratio(g, name) for g in groups]
        within[name] = [x >= 0.95 for x in r]
        reach = sum(interval(g, name)[1] >= 0.95 for g in groups)
        held = [held_out(g, name) for g in groups]
        lines.append(f"\n{label}: median {statistics.median(r):.2f}, min {min(r):.2f}; within 5% in "
                     f"{sum(x >= 0.95 for x in r)} of {len(r)} groups; 90% interval reaching 0.95 in {reach} of {len(r)}; "
                     f"against the best picked on the other half of the repeats: median {statistics.median(held):.2f}, "
                     f"min {min(held):.2f}, within 5% in {sum(x >= 0.95 for x in held)} of {len(held)} "
                     f"({', '.join(f'{x:.2f}' for x in held)})")
    missed = [f"B = {g['B']}, T = {g['T']:g}" for g, rl, pr in zip(groups, within["auto_rl"], within["auto_profiled"])
              if not (rl and pr)]
    lines.append(f"\nauto as bebop rl and bebop generate run it (RL-style and profiled) within 5% of the best in every "
                 f"group: {'yes' if not missed else 'no (' + '; '.join(missed) + ')'} (in "
                 f"{pass_rate(groups, ('auto_rl', 'auto_profiled')):.0%} of bootstrap resamples of the repeats; the "
                 f"oracle alone in {pass_rate(groups, ('oracle',)):.0%}); a model's first call (one-shot): "
                 f"{sum(within['auto'])} of {len(groups)}")
    floor = [_ratio(g, "oracle") for g in groups]
    lines.append(f"\noracle (the grid's best so far, at no cost) within 5% of the best in {sum(x >= 0.95 for x in floor)} "
                 f"of {len(floor)} groups ({', '.join(f'{x:.2f}' for x in floor)}): the bar's floor at this run's noise")
    for label, name in (("RL-style", "auto_rl"), ("profiled", "auto_profiled")):
        over = [g["pooled"][name] / g["pooled"]["oracle"] for g in groups]
        spans = [interval(g, name, against="oracle") for g in groups]
        lines.append(f"\n{label} / oracle (same repeats and seeds, pooled): median {statistics.median(over):.3f}, "
                     f"min {min(over):.3f}; per group " + ", ".join(f"{x:.2f} [{lo:.2f}, {hi:.2f}]"
                                                                     for x, (lo, hi) in zip(over, spans)))
    choices = [g["rl_choices_tok_s"] / max(_grid(g, "pooled").values()) for g in groups]
    lines.append(f"\nRL-style's choices alone (the grid's calls of the setting it chose at each call, pooled)/best: "
                 f"median {statistics.median(choices):.2f}, min {min(choices):.2f}; within 5% in "
                 f"{sum(x >= 0.95 for x in choices)} of {len(choices)} ({', '.join(f'{x:.2f}' for x in choices)})")
    lines.append(f"\nnoise: sd / median of the best fixed setting's repeats, median over groups "
                 f"{statistics.median(noise(g) for g in groups):.0%}")
    return "\n".join(lines)


def run_ab_group(model, tok, head, batch: int, temperature: float, args) -> dict:
    """The fixed settings and every arm's choosers at (B, T), interleaved -> the group's ratios."""
    prompts = make_prompts(batch)
    fixed = {n: Method(*SETTINGS[GRID.index(n)]) for n in args.settings}
    choosers = {f"{arm}{i}": RlAuto(args.auto_every, AutoChooser(every=args.auto_every, **ARMS[arm]))
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
            "choices": rl.choices, "probes": rl.probes}  # NOTE: each probe's prices, to read a lock-in's cause
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


def ab_summary(groups: list[dict], arms: list[str]) -> str:
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
                " ".join(f"{n} {spent[n]}" for n in GRID if spent[n]))
        if arm != base:
            diffs = [100 * (arm_mean(g, arm) - arm_mean(g, base)) for g in groups]
            se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
            line += (f"\n           vs {base}: {statistics.fmean(diffs):+.2f} points (se {se:.2f}), "
                     f"ahead in {sum(d > 0 for d in diffs)} of {len(diffs)} groups")
        lines.append(line)
    return "\n".join(lines)


def main_grid(args: argparse.Namespace) -> None:
    model, tok, head = open_bench(args, "bench.auto grid")
    groups, start = run_groups(
        args, lambda batch, temperature: run_group(model, tok, head, batch, temperature, args),
        lambda g: f"auto chose {g['decisions']} (its calls / the grid's call of its choice, same repeat: median "
                  f"{g['auto_own']:.3f}), profiled {g['profiled_choices']}, RL-style {g['rl_choices']} (the same: "
                  f"median {g['rl_own']:.3f}; canary {g['canary'] * 1e3:.1f} ms), oracle "
                  f"{dict(collections.Counter(g['oracle_choices']))}")
    print("### auto vs the best fixed setting (tok/s at the machine's reference speed, medians; RL-style pooled)\n\n"
          + format_table(groups))
    print(summary(groups, args.auto_every))
    timed = [g["timed"] for g in groups]
    print("\n### The same, raw seconds (no speed correction)\n\n" + format_table(timed))
    print(summary(timed, args.auto_every))
    print("\n### Prediction error (predicted / measured - 1, raw seconds)\n\n" + format_errors(timed))
    print("\n### Every setting: measured tok/s, raw seconds\n\n" + format_grid(timed))
    print(f"\ntotal {time.perf_counter() - start:.0f}s, load {os.getloadavg()[0]:.1f} at the end")
    if args.out:
        save_jsonl(args.out, groups)


def main_ab(args: argparse.Namespace) -> None:
    model, tok, head = open_bench(args, "bench.auto ab", f"arms {' '.join(args.arms)} x {args.choosers}")
    groups = []
    for batch in args.batch_sizes:
        for temperature in args.temperatures:
            start = time.perf_counter()
            with stage(f"bench.auto ab: B={batch} T={temperature:g}"):
                group = run_ab_group(model, tok, head, batch, temperature, args)
            groups.append(group)
            print(format_group(group, args.arms) + f"\n  ({time.perf_counter() - start:.0f} s)", flush=True)
            if args.out:
                with open(args.out, "a") as f:
                    f.write(json.dumps(group) + "\n")
    print(ab_summary(groups, args.arms), flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    (main_grid if args.command == "grid" else main_ab)(args)


if __name__ == "__main__":
    main()
