"""The probe's forecast of the rest of a call against that rest, each setting forced after a normal probe.

    PYTHONPATH=. .venv/bin/python bench/auto_bias.py --threads 1     # B 16/64 x T 0.3/0.7/1, 16 rounds: ~3 min
    PYTHONPATH=. .venv/bin/python bench/auto_bias.py --quick         # B 16, T 1, 1 round: ~5 s

A probing call (``generate_auto``) prices every setting for the rest of the call and runs the one
priced fastest: the choice turns on the differences between the prices, and an error all settings
share moves nothing. Here one chooser per (B, T) runs probing calls as ``bebop rl``'s scheduled
probes do (the chooser carried from call to call), except that the rest of each call runs a setting
the bench picks: every ``--settings`` entry once per round, in an order drawn anew for each round
(``rollout.run_order``), round r with sampling seed r. So every setting's forecast meets its own
measurement in the same kind of call, at the machine's speed of that moment. Every setting runs
whole calls here, so each K's acceptance rests on its own steps: the acceptance side is at its
best, and the errors left are mostly the costs' and the tail's. A first call (rs2, not counted)
gives the chooser completion lengths and acceptance, as a run's first call does.
Per setting, medians over the rounds:
    forecast    the decision's tok/s predicted for the rest of the call / the tok/s measured there - 1
    step cost   the rest's steps priced at the probe (the depth's ``StepCosts.step_seconds`` x
                ``scale`` at each step's rows) / their measured seconds - 1 (+: priced dear)
    tokens      (1 + forecast) (1 + step cost) - 1: the error left to the tokens per step and the tail
    steps       the rest's expected steps as the decision priced them (``bebop.speculative.auto.tail.activity``:
                while some row is active) / the steps it ran - 1 (-: it ran longer than priced)
    row-steps   the same for the rows summed over those steps (each row's own steps): right where
                steps is wrong, the rows' mean is priced well and the call's longest row is not
    timed       rounds in which the probe timed that depth itself (else the verify line priced it)
and the spread of the forecast errors over the settings (largest - smallest): a spread as wide as
the gaps between the settings' speeds is what makes a probe choose the wrong one.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from auto import SETTINGS, open_bench, parse_common, run_auto  # noqa: E402
from rollout import make_prompts, run_order  # noqa: E402

from bebop.speculative.auto.chooser import AutoChooser, Decision, StepCosts, config_name  # noqa: E402
from bebop.speculative.auto.tail import activity  # noqa: E402

NAMES = [config_name(m, k) for m, k in SETTINGS]
QUICK = {"batch_sizes": [16], "temperatures": [1.0], "rounds": 1}


@dataclass
class _Recorded(StepCosts):
    """Step costs that keep the step times of their last ``observe`` (a probing call's last: the rest)."""

    last: list = field(default_factory=list)

    def observe(self, k, step_times):
        self.last = list(step_times)
        super().observe(k, step_times)


class Forced(AutoChooser):
    """A chooser that probes and prices as ``AutoChooser`` does but runs ``force`` after the probe,
    keeping what the probe priced for it."""

    def __init__(self) -> None:
        super().__init__()
        self.force: tuple[str, int] = ("rs", 2)
        self.priced: tuple[float, float] | None = None  # (step_seconds, gamma) of the forced depth
        self.timed = False  # the probe timed the forced depth itself
        self.steps = float("nan")  # E[steps of the rest] at the forced setting, as the decision priced it
        self.row_steps = float("nan")  # E[rows summed over the rest's steps], likewise

    def restart(self) -> None:
        super().restart()
        recorded = _Recorded()
        recorded.__dict__.update(vars(self.costs))  # whatever the probe keeps, recorded
        self.costs = recorded

    def choose(self, options, rows, tail=None) -> Decision:
        found = super().choose(options, rows, tail)
        mode, k = self.force
        depth = 0 if mode == "none" else k
        self.priced = (self.costs.step_seconds(depth), self.costs.gamma(depth))
        self.timed = depth in self.costs.seconds
        if tail is not None:
            alphas = [] if mode == "none" else self.acceptance.offset_alphas(mode, k)
            some_active, active = activity(tail, [alphas])
            self.steps, self.row_steps = float(some_active.sum()), float(active.sum())
        name = config_name(mode, k)
        return Decision(mode, k, found.predictions[name], found.predictions, found.rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64], help="rows B per call")
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.3, 0.7, 1.0], help="T (> 0)")
    ap.add_argument("--settings", nargs="+", default=["none", "rs1", "rs2", "rs3", "rs4"], choices=NAMES,
                    help="the settings forced after the probe")
    ap.add_argument("--rounds", type=int, default=16, help="calls per setting")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="completion tokens per row, EOS included")
    ap.add_argument("--quick", action="store_true", help="B 16, T 1, 1 round")
    args = parse_common(ap, argv, QUICK)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    args.repeats = args.rounds  # read by rollout.header
    return args


def run_group(model, tok, head, batch: int, temperature: float, args) -> dict[str, dict[str, list]]:
    """Every setting forced ``--rounds`` times at (B, T) -> per setting the rounds' errors."""
    prompts, chooser = make_prompts(batch), Forced()
    run_auto(model, tok, head, prompts, temperature, args.max_new_tokens, chooser, seed=10**6)  # history
    found: dict[str, dict[str, list]] = {n: collections.defaultdict(list) for n in args.settings}
    for r in range(args.rounds):
        for name in run_order(args.settings, r):
            chooser.force = SETTINGS[NAMES.index(name)]
            _, _, decision = run_auto(model, tok, head, prompts, temperature, args.max_new_tokens, chooser, seed=r)
            rest = chooser.costs.last
            if not rest or not decision.measured_tok_s > 0:
                continue  # the call ended in its probe
            (seconds, gamma), measured = chooser.priced, sum(s for _, s, _ in rest)
            priced = sum(seconds * (1.0 + gamma * rows) for rows, _, _ in rest) if seconds else float("nan")
            forecast, cost = decision.predicted_tok_s / decision.measured_tok_s - 1, priced / measured - 1
            found[name]["forecast"].append(forecast)
            found[name]["cost"].append(cost)
            found[name]["tokens"].append((1 + forecast) * (1 + cost) - 1)
            found[name]["timed"].append(chooser.timed)
            found[name]["steps"].append(chooser.steps / len(rest) - 1)
            found[name]["row_steps"].append(chooser.row_steps / sum(rows for rows, _, _ in rest) - 1)
    return found


def format_group(batch: int, temperature: float, found: dict[str, dict[str, list]]) -> str:
    lines = [f"B={batch} T={temperature}:"]
    medians = {}
    for name, errors in found.items():
        if not errors["forecast"]:
            lines.append(f"  {name:<5} no call ran past its probe")
            continue
        medians[name] = statistics.median(errors["forecast"])
        lines.append(f"  {name:<5} forecast {medians[name]:+.2f}  step cost {statistics.median(errors['cost']):+.2f}  "
                     f"tokens {statistics.median(errors['tokens']):+.2f}  steps {statistics.median(errors['steps']):+.2f}  "
                     f"row-steps {statistics.median(errors['row_steps']):+.2f}  timed {sum(errors['timed'])}/"
                     f"{len(errors['timed'])}")
    if medians:
        lines.append(f"  spread of the forecast errors {max(medians.values()) - min(medians.values()):.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    model, tok, head = open_bench(args, "auto_bias.py")
    for batch in args.batch_sizes:
        for temperature in args.temperatures:
            print(format_group(batch, temperature, run_group(model, tok, head, batch, temperature, args)), flush=True)


if __name__ == "__main__":
    main()
