"""check-lossless's verdict, measured: how often it calls an exact sampler "not lossless", and how often it
catches each deliberately broken sampler of the test suite, at the default settings.

Three parts, each a markdown table:

1. ``exact``: the default procedure (3 tested prompts, ``LOSSLESS_CONFIGS``, 10,000 samples, alpha 3e-4,
   retests) run end to end over many seeds on an exact sampler (``tests.check.samplers.ChainSampler``:
   plain and speculative rows from one Markov chain, so every difference is chance). It counts failing
   checks, runs with a first-sample failure, retests and false verdicts; the false-verdict rate is then
   estimated from the measured per-check rate r as sum_e (r * n_e)^2, since direct counts of an event
   below 1e-3 need more runs than a bench can afford.
2. ``engine``: a smaller run of the same procedure through Bebop's engine on a tiny model (V = 8).
3. ``broken``: each broken sampler of ``tests.check.samplers.BROKEN`` through the procedure at the default
   sample count, over several seeds: the share of runs called "not lossless" and the largest p-value
   of the retest's worst check.

Usage (from the repository root; 15-60 minutes at the defaults on 2 shared cores, most of it the exact-sampler runs):
    PYTHONPATH=. .venv/bin/python bench/lossless_verdict.py --runs 200 --engine-seeds 10 --broken-seeds 3
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import pytest
import scipy.stats

from bebop.check.config import DEFAULT_ALPHA, DEFAULT_NUM_SAMPLES, DEFAULT_TESTED_PROMPTS
from bebop.check.lossless import LOSSLESS_CONFIGS, run_lossless_checks
from bebop.check.verdict import false_alarm_bound, false_alarm_odds, summarize_checks
from bebop.utils.progress import stage
from tests.check.samplers import BROKEN, ChainSampler, tiny_model
from tests.helpers.engine import ToyTokenizer

PROMPTS = [[3], [5, 1], [2, 2, 7, 4], [6, 6]]  # token ids: the first three are tested, the last only mixed in
ENGINE_SAMPLES = 3000  # rows per sample on the tiny model: the engine part's runs take seconds each
CONFIDENCE = 0.95  # of the intervals printed


def _upper(count: int, runs: int) -> float:
    """One-sided Clopper-Pearson upper bound on a rate seen ``count`` times in ``runs``."""
    return 1.0 if count >= runs else float(scipy.stats.beta.ppf(CONFIDENCE, count + 1, runs - count))


def _interval(count: int, runs: int) -> str:
    low = 0.0 if count == 0 else float(scipy.stats.beta.ppf((1 - CONFIDENCE) / 2, count, runs - count + 1))
    high = 1.0 if count == runs else float(scipy.stats.beta.ppf((1 + CONFIDENCE) / 2, count + 1, runs - count))
    return f"{count / runs:.3g} [{low:.2g}, {high:.2g}]"


def _tally(runs: list[list]) -> dict:
    """Counts over runs of the procedure: checks, failing checks, runs with a first failure, false verdicts."""
    summaries = [summarize_checks(checks) for checks in runs]
    first = [c for checks in runs for c in checks if not c.retest]
    return dict(
        runs=len(runs), checks=sum(c.informative for c in first), failed=sum(c.failed for c in first),
        first_failure=sum(s.num_failed > 0 for s in summaries), retests=sum(any(c.retest for c in r) for r in runs),
        not_lossless=sum(s.verdict == "not lossless" for s in summaries),
        sizes=summaries[0].event_sizes, informative=summaries[0].num_informative,
    )


def exact_part(num_runs: int, samples: int, alpha: float) -> list[str]:
    start, results = time.perf_counter(), []
    for seed in range(num_runs):
        results.append(run_lossless_checks(None, None, object(), num_samples=samples, seed=seed, prompts=PROMPTS,
                                           alpha=alpha, backend=ChainSampler(), num_tested_prompts=DEFAULT_TESTED_PROMPTS))
    t = _tally(results)
    rate = t["failed"] / t["checks"]
    rate_high = _upper(t["failed"], t["checks"])
    return [
        f"### exact sampler, default procedure ({num_runs} seeds, {samples} samples, alpha {alpha:g}, "
        f"{time.perf_counter() - start:.0f} s)", "",
        "| quantity | measured (95% interval) | predicted at alpha |", "|---|---|---|",
        f"| per-check failure rate ({t['checks']} informative checks) | {_interval(t['failed'], t['checks'])} | {alpha:g} |",
        f"| runs with a first-sample failure | {_interval(t['first_failure'], num_runs)} | "
        f"<= {false_alarm_odds(alpha, t['informative']):.3g} (1 - (1 - alpha)^{t['informative']}) |",
        f"| runs with a retest | {t['retests']} of {num_runs} | |",
        f"| runs called not lossless | {t['not_lossless']} of {num_runs} (upper {_upper(t['not_lossless'], num_runs):.2g}) "
        f"| <= {false_alarm_bound(alpha, list(t['sizes'])):.2g} |",
        f"| runs called not lossless, from the per-check rate: sum_e (r n_e)^2 | "
        f"{false_alarm_bound(rate, list(t['sizes'])):.2g} (upper {false_alarm_bound(rate_high, list(t['sizes'])):.2g}) "
        f"| {false_alarm_bound(alpha, list(t['sizes'])):.2g} |",
        "",
    ]


def engine_part(num_seeds: int, samples: int, alpha: float) -> list[str]:
    start = time.perf_counter()
    model, head = tiny_model()
    results = [run_lossless_checks(model, ToyTokenizer(), head, num_samples=samples, seed=seed, prompts=PROMPTS,
                                   alpha=alpha, num_tested_prompts=DEFAULT_TESTED_PROMPTS)
               for seed in range(num_seeds)]
    t = _tally(results)
    return [
        f"### Bebop's engine on a tiny model (V = 8), default settings ({num_seeds} seeds, {samples} samples, "
        f"alpha {alpha:g}, {time.perf_counter() - start:.0f} s)", "",
        "| quantity | measured | predicted at alpha |", "|---|---|---|",
        f"| failing checks | {t['failed']} of {t['checks']} | {alpha * t['checks']:.2g} expected |",
        f"| runs with a first-sample failure | {t['first_failure']} of {num_seeds} | "
        f"{false_alarm_odds(alpha, t['informative']):.2g} each |",
        f"| runs called not lossless | {t['not_lossless']} of {num_seeds} | "
        f"<= {false_alarm_bound(alpha, list(t['sizes'])):.2g} each |",
        "",
    ]


def broken_part(num_seeds: int, samples: int, alpha: float) -> list[str]:
    lines = [f"### broken samplers ({num_seeds} seeds each, {samples} samples, alpha {alpha:g})", "",
             "| broken sampler | settings | caught (not lossless) | worst retest p-value, largest over seeds | s |",
             "|---|---|---|---|---|"]
    for name, broken in BROKEN.items():
        start, (model, head) = time.perf_counter(), broken.model()
        caught, worst = 0, 0.0
        with pytest.MonkeyPatch.context() as mp:
            broken.patch(mp)
            for seed in range(num_seeds):
                checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=samples,
                                             seed=seed, prompts=PROMPTS, alpha=alpha, configs=broken.configs)
                caught += summarize_checks(checks).verdict == "not lossless"
                retest = [c.p_value for c in checks if c.retest] or [1.0]
                worst = max(worst, min(retest))
        settings = "; ".join(f"{c.mode}{' block' if c.verify == 'block' else ''} K={c.speculate_k} T={c.temperature:g}"
                             + (" top-k/top-p" if c.top_p < 1 else "") for c in broken.configs)
        lines.append(f"| {name} | {settings} | {caught} of {num_seeds} | {worst:.2g} | "
                     f"{time.perf_counter() - start:.0f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--runs", type=int, default=200, help="seeds of the exact-sampler simulation (0: skip)")
    parser.add_argument("--engine-seeds", type=int, default=10, help="seeds of the tiny-model engine run (0: skip)")
    parser.add_argument("--broken-seeds", type=int, default=3, help="seeds per broken sampler (0: skip)")
    parser.add_argument("--samples", type=int, default=DEFAULT_NUM_SAMPLES, help="rows per sample (exact and broken)")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="per-check false-alarm odds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    print(f"# check-lossless verdict: {platform.node()}, {os.cpu_count()} cores, {args.threads} torch thread(s), "
          f"load {os.getloadavg()[0]:.1f}; {len(LOSSLESS_CONFIGS)} settings x {DEFAULT_TESTED_PROMPTS} tested prompts\n")
    parts = [(args.runs, exact_part, args.samples), (args.engine_seeds, engine_part, ENGINE_SAMPLES),
             (args.broken_seeds, broken_part, args.samples)]
    for count, part, samples in parts:
        if count:
            with stage(f"bench/lossless_verdict.py: {part.__name__}, {count} seeds"):
                lines = part(count, samples, args.alpha)
            print("\n".join(lines), flush=True)
    print(f"load at the end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
