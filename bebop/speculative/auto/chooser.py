"""The chooser of ``--mode auto`` / ``--speculate-k auto``: its models, its decision, its probe schedule.

``AutoChooser`` predicts each candidate (mode, K)'s tokens/s for the rest of a call. Acceptance (decayed
by DECAY a call) and lengths carry over between calls; step costs are a probing call's own (``restart``).
"""

from __future__ import annotations

import dataclasses
import math
import re

import numpy as np

from bebop.config import AUTO, AUTO_EVERY, AUTO_MAX_K
from bebop.speculative.auto.acceptance import DECAY, Acceptance, expected_accepted
from bebop.speculative.auto.costs import StepCosts
from bebop.speculative.auto.tail import Lengths, Rows, call_rates
from bebop.speculative.completions import Completions, Decision
from bebop.speculative.settings import SpecConfig


def candidates(spec: SpecConfig) -> list[tuple[str, int]]:
    """The (mode, K) pairs a spec allows, K = 0 for ``none``; simplest first (ties keep the first).
    Example: candidates(SpecConfig("rs", "auto")) -> [("rs", 1), ("rs", 2), ("rs", 3), ("rs", 4)]."""
    modes = ("none", "to", "rs") if spec.mode == AUTO else (spec.mode,)
    ks = range(1, AUTO_MAX_K + 1) if spec.speculate_k == AUTO else (spec.speculate_k,)
    return [(m, 0) if m == "none" else (m, k) for m in modes for k in ((0,) if m == "none" else ks)]


def config_name(mode: str, k: int) -> str:
    """"none", "rs2", "to4", ...: a (mode, K) as metrics and profiles name it."""
    return mode if mode == "none" else f"{mode}{k}"


def _setting_name(name) -> str:
    """``name`` when it names a setting (``config_name``: none, to<K>, rs<K>); ValueError otherwise."""
    if not isinstance(name, str) or not re.fullmatch(r"none|(to|rs)[1-9][0-9]*", name):
        raise ValueError(f"unknown setting name {name!r} (none, to<K> or rs<K>)")
    return name


def predict(mode: str, k: int, acceptance: Acceptance, costs: StepCosts, rows: float) -> float:
    """Tokens/s of (mode, K) at ``rows`` decoding rows, no tail: rows (1 + E[L]) / step cost (0: unknown cost).
    Example: rs, K=2, alpha_RS = [0.5, 0.5], 0.01 s per step, 4 rows -> 4 * 1.75 / 0.01 = 700."""
    seconds = costs.step_seconds(0 if mode == "none" else k)
    if not seconds:
        return 0.0
    tokens = 1.0 if mode == "none" else 1.0 + expected_accepted(acceptance.alphas(mode, k))
    return rows * tokens / seconds


class AutoChooser:
    """A run's acceptance, cost and length models, its held decision and its probe schedule."""

    def __init__(self, confirm: bool = True, every: int = AUTO_EVERY) -> None:
        self.acceptance = Acceptance()
        self.costs = StepCosts()
        self.lengths = Lengths()
        self.held: Decision | None = None  # the latest probe's decision, kept by the calls until the next probe
        self.confirm = confirm  # a setting first chosen is checked by a probe in the next call (``settle``)
        self.every = every  # a probing call every this many calls (``should_probe``)
        self.calls = 0  # calls made with this chooser (``generate_auto`` counts them)
        self.tried: set[str] = set()  # the settings decisions chose: each ran the rest of a call at least

    def should_probe(self, spec: SpecConfig) -> bool:
        """Whether the next call probes: the first and every ``every``-th, or no confirmed allowed decision held."""
        return self.calls % self.every == 0 or not self.holds(candidates(spec))

    def holds(self, options: list[tuple[str, int]]) -> bool:
        """Whether a call can keep the held decision: one was made, confirmed, and among ``options``."""
        return self.held is not None and self.held.confirmed and (self.held.mode, self.held.speculate_k) in options

    def restart(self) -> None:
        """A probe's start: forgets the step costs, so the probe times every setting at the machine's speed now."""
        self.costs = StepCosts()

    def settle(self, decision: Decision) -> None:
        """Holds a probe's decision; with ``confirm``, a setting no decision chose before is held for one
        call only (the next call probes again, with a whole call's acceptance at that setting)."""
        name = config_name(decision.mode, decision.speculate_k)
        decision.confirmed = not (self.confirm and name not in self.tried)
        self.tried.add(name)
        self.held = decision

    def observe(self, result: Completions, mode: str, greedy: bool) -> None:
        """Learns a fixed setting's call: its alphas (older ones decayed by DECAY) and lengths, not its step times."""
        self.acceptance.decay(DECAY)
        if mode != "none" and result.log is not None:
            self.acceptance.observe(result.log, result.lengths, greedy, age=DECAY)
        self.lengths.add(result.lengths)

    def rates(self, options: list[tuple[str, int]], rows: Rows) -> dict[str, float]:
        """Tokens/s of each (mode, K) over the rest of ``rows`` (``call_rates``); 0 where the costs cannot say."""
        names = [config_name(m, k) for m, k in options]
        bases = [self.costs.step_seconds(0 if m == "none" else k) for m, k in options]
        known = [i for i, b in enumerate(bases) if b]
        out = dict.fromkeys(names, 0.0)
        if known:
            alphas = [[] if options[i][0] == "none" else self.acceptance.offset_alphas(*options[i]) for i in known]
            found = call_rates(rows, alphas, np.array([bases[i] for i in known]))
            out.update({names[i]: float(r) for i, r in zip(known, found)})
        return out

    def shallow_could_win(self, options: list[tuple[str, int]], rows: float) -> int | None:
        """The shallower drafted depth with the highest ``predict`` if it beats the deepest's, else None: worth
        probing (with one depth timed, c_verify's slope is the prefill's, which errs toward shallower K)."""
        rule = probe_rule(options)
        depths = sorted(k for m, k in options if m == rule)
        if len(depths) < 2:
            return None
        rates = {k: predict(rule, k, self.acceptance, self.costs, rows) for k in depths}
        best = max(depths[:-1], key=rates.get)
        return best if rates[best] > rates[depths[-1]] else None

    def choose(self, options: list[tuple[str, int]], rows: float, tail: Rows | None = None) -> Decision:
        """The candidate with the highest predicted tokens/s (first of equals): ``rates`` of ``tail`` or ``predict``."""
        if tail is None:
            predictions = {config_name(m, k): predict(m, k, self.acceptance, self.costs, rows) for m, k in options}
        else:
            predictions = self.rates(options, tail)
        mode, k = max(options, key=lambda c: predictions[config_name(*c)])
        return Decision(mode, k, predictions[config_name(mode, k)], predictions, rows)

    def to_state(self) -> dict:
        """The JSON-able state a profile carries; not the step costs (a probe times its own)."""
        held = dataclasses.asdict(self.held) if self.held is not None else None
        return {"acceptance": self.acceptance.to_state(), "lengths": self.lengths.seen,
                "held": held and {k: v if v == v else None for k, v in held.items()},  # NOTE: nan is not JSON
                "confirm": self.confirm, "every": self.every, "tried": sorted(self.tried)}

    @classmethod
    def from_state(cls, state: dict) -> AutoChooser:
        """The chooser ``to_state`` wrote; KeyError, TypeError or ValueError when the state does not fit."""
        chooser = cls(confirm=bool(state["confirm"]), every=int(state["every"]))
        if chooser.every < 1:
            raise ValueError(f"every {chooser.every} < 1")
        chooser.tried = {_setting_name(name) for name in state["tried"]}
        chooser.acceptance = Acceptance.from_state(state["acceptance"])
        chooser.lengths = Lengths([int(n) for n in state["lengths"]])
        held = state["held"]
        if held is not None:
            fields = {f.name for f in dataclasses.fields(Decision)}
            if set(held) != fields:
                raise ValueError(f"a held decision has fields {sorted(held)}, not {sorted(fields)}")
            chooser.held = Decision(**{k: math.nan if v is None else v for k, v in held.items()})
            mode, k = chooser.held.mode, chooser.held.speculate_k
            _setting_name(mode if (mode, k) == ("none", 0) else f"{mode}{k!r}")  # NOTE: repr: K "3" is not K 3
            chooser.held.predictions = {_setting_name(n): float(v) for n, v in chooser.held.predictions.items()}
        return chooser


def probe_rule(options: list[tuple[str, int]]) -> str | None:
    """The rule of drafted probe steps: ``rs`` when allowed (its steps record both alphas), else ``to``."""
    modes = {m for m, _ in options if m != "none"}
    return "rs" if "rs" in modes else ("to" if modes else None)
