"""Automatic mode/K (``bebop.speculative.auto.chooser``) against the best fixed setting found by grid search, same run.

    PYTHONPATH=. .venv/bin/python bench/auto.py --threads 1     # T 0.3/0.7/1, B 1/16/64, 80 repeats (160 at B = 1): ~27 min here
    PYTHONPATH=. .venv/bin/python bench/auto.py --quick         # B 16, T 1, 3 repeats: ~15 s

Defaults: the embedded model and its e2e-TV head (both trained and cached on first use), the
embedded task's prompts, 48 new tokens.

At each (B, T) every setting runs once per repeat, in an order drawn anew for each repeat
(``rollout.run_order``), so a noisy phase of the machine, or a slot's own bias, hits all of them
alike, repeat r with sampling seed r in every setting
(each repeat a new draw of the completions and their acceptance); tok/s are medians of the repeats.
Speed-corrected: a canary forward of the model is timed after every call (``rollout.Speedometer``),
and each call's seconds are read at the group's median canary speed (x median canary / the canary
around the call): this machine runs ~2x slower for seconds at a time, and the correction halves the
best setting's call-to-call spread. The tables come twice, corrected first, then on raw seconds;
the prediction errors are on raw seconds (what the choosers timed).
    grid        none, to and rs at K = 1..4 (9 fixed settings).
    one-shot    ``generate_auto`` with mode and K auto and a fresh ``AutoChooser`` per call, as
                ``bebop generate --mode auto --speculate-k auto --auto-profile none`` runs (a model's
                first call): its probe steps are part of its time. Reported; the bar below is on
                the choosers with a history.
    RL-style    one ``AutoChooser`` across the group's calls, as ``bebop rl`` keeps it: a probing
                ``generate_auto`` call every ``--auto-every`` calls, ``probe=False`` (the last probe's
                choice kept, no probe steps) in the others; tok/s pooled over its calls (the
                probing call included), against the best setting's pooled tok/s.
    profiled    ``bebop generate`` with an auto profile (``bebop.speculative.auto.profile``): each call starts
                from the chooser the previous call saved (its JSON state read back after that call's
                canary: nothing held in memory), probing every AUTO_EVERY calls; the profile's file
                I/O is not timed (a CLI call's model load dwarfs it). Pooled like RL-style.
    oracle      a control, not a chooser: each repeat it runs the fixed setting with the best pooled
                tok/s of the grid's calls made so far in the group (raw seconds; its first call, with
                none made yet, plain), at no cost of its own and in a random slot like the others. What
                a chooser that always knew the best would measure: its ratio to the best is the bar's
                floor at this run's noise (the best of 9 noisy estimates is read high; the oracle's own
                calls are not the ones that picked it), and RL-style / oracle (same repeats, same
                seeds, pooled) is what the chooser's choices and own work cost, free of that bias.
Columns:
    best        the grid's fastest setting and its tok/s.
    one-shot/best
                one-shot's tok/s over the best's, with a 90% bootstrap interval
                (``interval``: the repeats resampled, the best re-picked in each resample). The
                summary lines add the ratio to the best picked on the other half of the repeats
                (``held_out``), free of the winner's curse of picking the best of 9 noisy medians.
    one-shot chose
                the setting one-shot picked (the most frequent over the repeats, and how often).
    chosen/best the grid tok/s of the chosen setting over the best's: the choice alone, without the
                probes' cost.
    one-shot/its choice
                median over the repeats of the one-shot's call / the grid's call of the setting it
                chose, same repeat (same seed): what its probe and pricing cost.
    RL-style/its choice
                median over the repeats of RL-style's call / the grid's call of the setting it chose,
                same repeat (same seed): what its probes, decisions and bookkeeping cost. The
                summary adds RL-style's choices alone: the grid's calls of the setting it chose at
                each call, pooled, over the best's (what it would reach at no cost of its own).
    oracle/best the oracle's pooled tok/s over the best's, with a 90% bootstrap interval.
    noise       standard deviation / median of the best setting's repeats: the machine's noise (what
                the speed correction leaves of it, in the corrected table).
The bar (the README's "Automatic mode and K"): auto as ``bebop rl`` and ``bebop generate`` run it,
RL-style and profiled, each within 5% of the best fixed setting (>= 0.95) in every (B, T); a line
of each summary ("auto as bebop rl and bebop generate run it ...") says whether the run met it (and in what
share of bootstrap resamples); the lines after it give the oracle's groups within 5% and RL-style
and profiled over the oracle.
Prediction error, predicted / measured - 1:
    tail model  for each RL-style call after the first, its chooser's forecast (made after the call
                before it and its canary) of a whole call of each grid setting (``AutoChooser.predict_call``:
                tail and prefill priced; median over the calls) against the grid's measured tok/s:
                median |error| over the 9 settings, and the error at the best setting and at
                RL-style's choice.
    previous    the same chooser's B (1 + E[L]) / step cost (``predict``), the model before the tail.
    one-shot    the one-shot auto's prediction of the rest of its call at the decision against the
                tok/s it measured there (no length history: rows assumed to run to the cap).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rollout import (Method, Speedometer, corrected, header, load, make_prompts, run_bebop, run_order,  # noqa: E402
                     warn_if_busy)

from bebop.config import AUTO_EVERY  # noqa: E402
from bebop.speculative import SamplingParams, SpecConfig  # noqa: E402
from bebop.speculative.auto.chooser import AUTO, AutoChooser, candidates, config_name, generate_auto, predict  # noqa: E402

SETTINGS = candidates(SpecConfig(AUTO, AUTO))  # none, to1..4, rs1..4
GRID = [config_name(m, k) for m, k in SETTINGS]
# NOTE: repeat r samples with seed r in every setting. One seed for all repeats would re-time a single
# draw of each setting's acceptance: at B = 1 a setting's "speed" was then the luck of its one draw
# (rs4 emitting 21 tokens in 4 steps where the expectation is 5.4), which no choice can predict.
QUICK = {"batch_sizes": [16], "temperatures": [1.0], "repeats": 3}
# NOTE: a B = 1 call lasts ~50 ms and its tok/s varies 11-29% from draw to draw (one row's acceptance),
# against 3-11% at B >= 16: 20 repeats left B = 1's ratios +-5 points from run to run, and RL-style's
# chooser 20 calls (two probes) to tell apart settings ~10% apart. Below SMALL_BATCH rows a group runs
# SMALL_BATCH // B times the repeats, at most SMALL_BATCH_MAX times (B = 1: 2x, ~1 min a group).
# NOTE: 40 repeats, not 20: at B >= 16 a group's ratio moved by 3-5 points between runs of the same code
# with 20, and 20 calls (two probes) are a short RL run: its first probe's models ruled half of it.
# NOTE: 80, not 40: two calls of one setting and seed in the same repeat differ by a log-ratio of rms 0.14
# (adjacent) to 0.18 (apart), whatever the canary says (B = 16, 80 repeats of three identical rs2 settings
# among eight: the canary's or the neighbouring calls' correction left 0.16-0.20), so a pooled ratio of
# 40 calls has a standard error of ~2.7% against the bar's 5% margin; 80 halve its variance.
SMALL_BATCH, SMALL_BATCH_MAX = 16, 2
BOOTSTRAP = 2000  # resamples of the repeats behind each 90% interval


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 16, 64], help="rows B per call")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7, 1.0], help="T (> 0)")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
    ap.add_argument("--repeats", type=int, default=80, help="timed calls per setting (more below 16 rows: SMALL_BATCH)")
    ap.add_argument("--auto-every", type=int, default=AUTO_EVERY, help="RL-style auto: probe every this many calls (bebop rl's default)")
    ap.add_argument("--quick", action="store_true", help="B 16, T 1, 3 repeats; overrides those flags")
    ap.add_argument("--out", default=None, help="JSONL, a line per group: every call's seconds and tokens, raw "
                                                "and speed-corrected, the canary, each chooser's choices")
    return parse_common(ap, argv, QUICK)


def parse_common(ap: argparse.ArgumentParser, argv: list[str] | None, quick: dict | None = None,
                 stat: str = "median") -> argparse.Namespace:
    """Adds the flags the auto benches share (--model, --mtp, --threads, --device; --stat, read by
    ``rollout.header``) and parses; with --quick, ``quick``'s values replace the parsed ones."""
    ap.add_argument("--model", default=None, help="HF model directory (default: the embedded model)")
    ap.add_argument("--mtp", default=None, help="MTP head directory (default: the embedded e2e_tv head)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    ap.add_argument("--stat", default=stat, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if quick and args.quick:
        for key, value in quick.items():
            setattr(args, key, value)
    return args


def pooled_tok_s(calls: list[tuple[float, int]]) -> float:
    """Tokens / seconds over (seconds, tokens) calls: a run's throughput, not the mean of its calls'."""
    return sum(t for _, t in calls) / sum(s for s, _ in calls)


def run_auto(model, tok, head, prompts, temperature: float, max_new: int, chooser=None, probe=True, seed=0):
    """One ``generate_auto`` call -> (seconds, tokens, decision)."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new)
    start = time.perf_counter()
    result, decision = generate_auto(model, tok, prompts, mtp=head, sampling=sampling, seed=seed,
                                     chooser=chooser, probe=probe)
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, sum(result.lengths), decision


class RlAuto:
    """Auto as ``bebop rl`` runs it: one chooser across the calls, probing every ``every`` calls and
    keeping that probe's choice in the others."""

    def __init__(self, every: int, chooser: AutoChooser | None = None):
        self.every, self.calls, self.chooser, self.decision = every, 0, chooser or AutoChooser(), None
        self.choices: list[str] = []  # the setting each call chose
        self.forecasts: list[dict] = []  # per call after the first: {"new"|"old": {setting: tok/s}}
        self.probes: list[dict] = []  # per probing call: its index, choice and every setting's predicted tok/s
        self.next_forecast: dict | None = None  # the next call's, made after the last call (``between``)
        self.batch = self.max_new = 0  # the last call's

    def forecast(self, batch: int, max_new: int) -> dict:
        """The chooser's whole-call predictions for its next call: tail-priced ("new"), and
        rows (1 + E[L]) / step cost at B rows ("old", the previous model)."""
        c = self.chooser
        return {"new": {config_name(m, k): c.predict_call(m, k, batch, max_new) for m, k in SETTINGS},
                "old": {config_name(m, k): predict(m, k, c.acceptance, c.costs, batch) for m, k in SETTINGS}}

    def call(self, model, tok, head, prompts, temperature: float, max_new: int, seed: int = 0) -> tuple[float, int]:
        if self.next_forecast is not None:
            self.forecasts.append(self.next_forecast)
        probe = self.calls % self.every == 0
        seconds, tokens, self.decision = run_auto(model, tok, head, prompts, temperature, max_new, self.chooser, probe,
                                                  seed)
        self.calls += 1
        self.choices.append(config_name(self.decision.mode, self.decision.speculate_k))
        if self.decision.probed:
            self.probes.append({"call": self.calls - 1, "chose": self.choices[-1],
                                "predictions": dict(self.decision.predictions)})
        self.batch, self.max_new = len(prompts), max_new
        return seconds, tokens

    def between(self) -> None:
        """The next call's forecast, made after a call and its canary reading: it lands before the next
        call of any name, whose "before" canary was read ahead of it.

        Why: made just before a held call, the forecast (~2 ms of numpy) left that call 1-2% slower at
        B = 1 (bench/auto_held.py, four runs); made after the call and before its canary reading, it
        slowed that 12-16 ms reading, and the speed correction put RL-style 3% above the oracle's
        identical calls (0.97-1.02 of them on raw seconds)."""
        self.next_forecast = self.forecast(self.batch, self.max_new)


def open_bench(args: argparse.Namespace, script: str, extra: str = ""):
    """An auto bench's start: sets torch's threads (--threads; 0 leaves torch's default), loads the
    model, tokenizer and head (``rollout.load``), prints the header line ("# bench/<script> | <setup>
    | <extra>") and warns when the machine is busy (``rollout.warn_if_busy``) -> (model, tok, head)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, head = load(args)
    setup = header(args, model, head, next(model.parameters()).device)
    print(f"# bench/{script} | {setup}" + (f" | {extra}" if extra else "") + "\n", flush=True)
    warn_if_busy()
    return model, tok, head


def side_by_side(model, tok, head, prompts, fixed: dict[str, Method], choosers: dict[str, RlAuto], temperature: float,
                 max_new: int, calls: int, seen=None) -> tuple[dict, dict]:
    """Fixed settings and RL-style choosers over the same calls: one warmup call of each fixed setting,
    then ``calls`` rounds in an order drawn anew for each (``rollout.run_order``), round r with
    sampling seed r everywhere -> ((seconds, tokens) per call, the canary after each call
    (``rollout.Speedometer``)), by name. ``seen(name, result)`` is called after each call with the
    fixed setting's ``Completions`` (None for a chooser's call)."""
    names = list(fixed) + list(choosers)
    timed: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
    canary: dict[str, list[float]] = {n: [] for n in names}
    for method in fixed.values():
        run_bebop(model, tok, head, prompts, method, temperature, 4)
    speed = Speedometer(model)
    for r in range(calls):
        for name in run_order(names, r):
            result = None
            if name in fixed:
                seconds, result, _ = run_bebop(model, tok, head, prompts, fixed[name], temperature, max_new, seed=r)
                timed[name].append((seconds, sum(result.lengths)))
            else:
                timed[name].append(choosers[name].call(model, tok, head, prompts, temperature, max_new, r))
            if seen is not None:
                seen(name, result)
            canary[name].append(speed.around())
            if name in choosers:
                choosers[name].between()
    return timed, canary


def round_trip(chooser: AutoChooser) -> AutoChooser:
    """The chooser a profile would carry: its JSON state written and read back (an independent copy)."""
    return AutoChooser.from_state(json.loads(json.dumps(chooser.to_state())))


class ProfiledAuto:
    """Auto as ``bebop generate`` runs it with a profile: every call runs the chooser the previous call
    saved (its JSON text read back between the calls), probing every AUTO_EVERY calls."""

    def __init__(self):
        self.chooser, self.calls = AutoChooser(), 0
        self.choices: list[str] = []  # the setting each call chose

    def call(self, model, tok, head, prompts, temperature: float, max_new: int, seed: int = 0) -> tuple[float, int]:
        seconds, tokens, decision = run_auto(model, tok, head, prompts, temperature, max_new, self.chooser,
                                             self.calls % AUTO_EVERY == 0, seed)
        self.calls += 1
        self.choices.append(config_name(decision.mode, decision.speculate_k))
        return seconds, tokens

    def between(self) -> None:
        """The chooser saved and read back, after a call and its canary reading (as ``RlAuto.between``)."""
        self.chooser = round_trip(self.chooser)


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
            if name in ("auto_rl", "auto_profiled"):
                (rl if name == "auto_rl" else profiled).between()
    reference = statistics.median(c for v in canary.values() for c in v)
    chosen, count = collections.Counter(config_name(d.mode, d.speculate_k) for d in decisions).most_common(1)[0]
    group = {"B": batch, "T": temperature, "canary": reference,
             "chosen": chosen, "chosen_count": count, "decisions": [config_name(d.mode, d.speculate_k) for d in decisions],
             "rest_error": statistics.median([d.predicted_tok_s / d.measured_tok_s - 1 for d in decisions
                                              if d.measured_tok_s > 0] or [float("nan")]),  # nan: ended in the probe
             "rl_chosen": config_name(rl.decision.mode, rl.decision.speculate_k), "rl_choices": rl.choices,
             "profiled_choices": profiled.choices, "oracle_choices": oracle,
             "forecast": {kind: {n: statistics.median(f[kind][n] for f in rl.forecasts) for n in GRID}
                          for kind in ("new", "old")} if rl.forecasts else None}
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


def errors(g: dict, kind: str) -> dict[str, float]:
    """predicted / measured - 1 per grid setting, the RL-style chooser's forecasts (median) against the grid."""
    grid = _grid(g)
    return {n: g["forecast"][kind][n] / grid[n] - 1 for n in grid} if g["forecast"] else {}


def format_errors(groups: list[dict]) -> str:
    lines = ["| B | T | tail model: median abs. error over settings | at the best | at RL-style's choice | "
             "previous model: median abs. error | one-shot, chosen, rest of call |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for g in groups:
        new, old, grid = errors(g, "new"), errors(g, "old"), _grid(g)
        if not new:
            continue
        best = max(grid, key=grid.get)
        lines.append(f"| {g['B']} | {g['T']:g} | {statistics.median(abs(e) for e in new.values()):.0%} | "
                     f"{new[best]:+.0%} | {new[g['rl_chosen']]:+.0%} | "
                     f"{statistics.median(abs(e) for e in old.values()):.0%} | "
                     f"{g['rest_error']:+.0%} |")
    return "\n".join(lines)


def format_grid(groups: list[dict]) -> str:
    names = [config_name(m, k) for m, k in SETTINGS]
    lines = ["| B | T | " + " | ".join(names) + " | one-shot auto | profiled auto | RL-style auto |",
             "|---:|---:|" + "---:|" * (len(names) + 3)]
    for g in groups:
        pred = g["forecast"]["new"] if g["forecast"] else {}
        cells = [f"{g['tok_s'][n]:.0f} ({pred.get(n, float('nan')):.0f})" for n in names]
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


def save_jsonl(path: str, rows: list[dict]) -> None:
    """``rows`` as JSON lines at ``path``, written to a temp file and renamed: never half-written."""
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, path)


def run_groups(args: argparse.Namespace, run, note) -> tuple[list[dict], float]:
    """``run(batch, temperature)`` at every (B, T) of ``args``, B outer, with a progress line on stderr
    after each ("[seconds] done B=.. T=..: " + ``note(group)``) -> (the groups, the start time)."""
    start, groups = time.perf_counter(), []
    for batch in args.batch_sizes:
        for temperature in args.temperatures:
            groups.append(run(batch, temperature))
            print(f"[{time.perf_counter() - start:.0f}s] done B={batch} T={temperature:g}: {note(groups[-1])}",
                  file=sys.stderr, flush=True)
    return groups, start


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, tok, head = open_bench(args, "auto.py")
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
    print("\n### Every setting: measured tok/s, raw seconds (RL-style chooser's forecast)\n\n" + format_grid(timed))
    print(f"\ntotal {time.perf_counter() - start:.0f}s, load {os.getloadavg()[0]:.1f} at the end")
    if args.out:
        save_jsonl(args.out, groups)


if __name__ == "__main__":
    main()
