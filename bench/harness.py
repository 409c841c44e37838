"""What the auto benches share (``bench.auto``): flags, the bench's start, auto as ``bebop rl`` and
``bebop generate`` run it, and fixed settings side by side with choosers.

Choosers here use the library's public API only: ``generate_auto`` with an ``AutoChooser`` that
keeps its own probe schedule (``AutoChooser.should_probe``), and its JSON state for profiles.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from bebop.config import AUTO, AUTO_EVERY
from bebop.speculative import SamplingParams, SpecConfig
from bebop.speculative.auto.chooser import AutoChooser, candidates, config_name
from bebop.speculative.auto.generate import generate_auto
from bebop.utils.progress import stage
from bench.rollout import Method, Speedometer, header, load, run_bebop, run_order, warn_if_busy

SETTINGS = candidates(SpecConfig(AUTO, AUTO))  # none, to1..4, rs1..4
GRID = [config_name(m, k) for m, k in SETTINGS]


def add_common(ap: argparse.ArgumentParser) -> None:
    """The flags every auto bench takes: --model, --mtp, --threads, --device."""
    ap.add_argument("--model", default=None, help="HF model directory (default: the embedded model)")
    ap.add_argument("--mtp", default=None, help="MTP head directory (default: the embedded e2e_tv head)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads; 0 = torch's default")
    ap.add_argument("--device", default="cpu", help="cpu, cuda or auto")


def open_bench(args: argparse.Namespace, name: str, extra: str = ""):
    """A bench's start: sets torch's threads (--threads; 0 leaves torch's default), loads the model,
    tokenizer and head (``bench.rollout.load``), prints the header line and warns when the machine
    is busy -> (model, tok, head)."""
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, head = load(args)
    setup = header(args, model, head, next(model.parameters()).device)
    print(f"# {name} | {setup}" + (f" | {extra}" if extra else "") + "\n", flush=True)
    warn_if_busy()
    return model, tok, head


def pooled_tok_s(calls: list[tuple[float, int]]) -> float:
    """Tokens / seconds over (seconds, tokens) calls: a run's throughput, not the mean of its calls'."""
    return sum(t for _, t in calls) / sum(s for s, _ in calls)


def run_auto(model, tok, head, prompts, temperature: float, max_new: int, chooser=None, seed=0):
    """One ``generate_auto`` call -> (seconds, tokens, decision)."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new)
    start = time.perf_counter()
    result, decision = generate_auto(model, tok, prompts, mtp=head, sampling=sampling, seed=seed, chooser=chooser)
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, sum(result.lengths), decision


class RlAuto:
    """Auto as ``bebop rl`` runs it: one chooser across the calls, on its probe schedule."""

    def __init__(self, every: int, chooser: AutoChooser | None = None):
        self.chooser, self.decision = chooser or AutoChooser(every=every), None
        self.choices: list[str] = []  # the setting each call chose
        self.probes: list[dict] = []  # per probing call: its index, choice and every setting's predicted tok/s

    def call(self, model, tok, head, prompts, temperature: float, max_new: int, seed: int = 0) -> tuple[float, int]:
        index = self.chooser.calls
        seconds, tokens, self.decision = run_auto(model, tok, head, prompts, temperature, max_new, self.chooser, seed)
        self.choices.append(config_name(self.decision.mode, self.decision.speculate_k))
        if self.decision.probed:
            self.probes.append({"call": index, "chose": self.choices[-1], "predictions": dict(self.decision.predictions)})
        return seconds, tokens


def round_trip(chooser: AutoChooser) -> AutoChooser:
    """The chooser a profile would carry: its JSON state written and read back (an independent copy)."""
    copy = AutoChooser.from_state(json.loads(json.dumps(chooser.to_state())))
    copy.calls = chooser.calls
    return copy


class ProfiledAuto:
    """Auto as ``bebop generate`` runs it with a profile: every call runs the chooser the previous call
    saved (its JSON text read back between the calls)."""

    def __init__(self):
        self.chooser = AutoChooser(every=AUTO_EVERY)
        self.choices: list[str] = []  # the setting each call chose

    def call(self, model, tok, head, prompts, temperature: float, max_new: int, seed: int = 0) -> tuple[float, int]:
        seconds, tokens, decision = run_auto(model, tok, head, prompts, temperature, max_new, self.chooser, seed)
        self.choices.append(config_name(decision.mode, decision.speculate_k))
        return seconds, tokens

    def between(self) -> None:
        """The chooser saved and read back, after a call and its canary reading (untimed)."""
        self.chooser = round_trip(self.chooser)


def side_by_side(model, tok, head, prompts, fixed: dict[str, Method], choosers: dict[str, RlAuto], temperature: float,
                 max_new: int, calls: int) -> tuple[dict, dict]:
    """Fixed settings and RL-style choosers over the same calls: one warmup call of each fixed setting,
    then ``calls`` rounds in an order drawn anew for each (``bench.rollout.run_order``), round r with
    sampling seed r everywhere -> ((seconds, tokens) per call, the canary after each call
    (``bench.rollout.Speedometer``)), by name."""
    names = list(fixed) + list(choosers)
    timed: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
    canary: dict[str, list[float]] = {n: [] for n in names}
    for method in fixed.values():
        run_bebop(model, tok, head, prompts, method, temperature, 4)
    speed = Speedometer(model)
    for r in range(calls):
        for name in run_order(names, r):
            if name in fixed:
                seconds, result, _ = run_bebop(model, tok, head, prompts, fixed[name], temperature, max_new, seed=r)
                timed[name].append((seconds, sum(result.lengths)))
            else:
                timed[name].append(choosers[name].call(model, tok, head, prompts, temperature, max_new, r))
            canary[name].append(speed.around())
    return timed, canary


def run_groups(args: argparse.Namespace, run, note) -> tuple[list[dict], float]:
    """``run(batch, temperature)`` at every (B, T) of ``args``, B outer, with a progress line on stderr
    after each ("[seconds] done B=.. T=..: " + ``note(group)``) -> (the groups, the start time)."""
    start, groups = time.perf_counter(), []
    for batch in args.batch_sizes:
        for temperature in args.temperatures:
            with stage(f"B={batch} T={temperature:g}"):
                groups.append(run(batch, temperature))
            print(f"[{time.perf_counter() - start:.0f}s] done B={batch} T={temperature:g}: {note(groups[-1])}",
                  file=sys.stderr, flush=True)
    return groups, start


def save_jsonl(path: str, rows: list[dict]) -> None:
    """``rows`` as JSON lines at ``path``, written to a temp file and renamed: never half-written."""
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(row) + "\n" for row in rows))
    os.replace(tmp, path)
