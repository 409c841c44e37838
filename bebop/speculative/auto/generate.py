"""``generate_auto``: one engine call that probes settings, chooses one, and decodes the rest at it.

Exactness: each step is an exact step of its setting, drawn from its rows' randomness at a counter no
other step uses, and a step's setting depends only on the steps before it (and on timings): each token
is drawn from p given its prefix whatever was chosen, and at T = 0 every step is greedy.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time

from bebop.config import AUTO
from bebop.speculative.auto.acceptance import DECAY
from bebop.speculative.auto.chooser import AutoChooser, Decision, candidates, probe_rule
from bebop.speculative.completions import Completions
from bebop.speculative.engine import Decoder
from bebop.speculative.settings import SamplingParams, SpecConfig, check_settings, head_problem
from bebop.utils.errors import BebopError

PROBE_STEPS = 2  # decode steps of each probed setting: enough to time a step, few enough to cost little
PROBE_POSITIONS = 8  # rows x steps of the deep probe at least: its alphas' evidence (a B = 1 probe runs longer)


def _block(decoder: Decoder, chooser: AutoChooser, setting, mode: str, k: int, steps_at_least: int,
           positions: int = 0) -> None:
    """Decodes at (mode, K) for ``steps_at_least`` steps, more until ``positions`` rows were decoded, and
    times them; a drafted block's first step also feeds the head what was pending: timed only if alone."""
    decoder.set_spec(setting(mode, k))
    steps = []
    while decoder.num_active and (len(steps) < steps_at_least or sum(r for r, _, _ in steps) < positions):
        steps.append(decoder.step())
    if steps:
        chooser.costs.observe(k, steps if k == 0 or len(steps) < 2 else steps[1:])


def _probe(decoder: Decoder, chooser: AutoChooser, options, setting, greedy: bool) -> None:
    """0. One plain step if plain is allowed (the call's first, nothing pending: the verify line's K = 0);
    1. PROBE_STEPS at the deepest K, more until PROBE_POSITIONS rows were drafted for (both alphas at every
    depth, c_draft, c_verify(K)); 2. PROBE_STEPS at the shallower K when it could win (``shallow_could_win``)."""
    rule = probe_rule(options)
    deepest = max(k for _, k in options)
    if ("none", 0) in options and len(options) > 1 and decoder.num_active:
        _block(decoder, chooser, setting, "none", 0, 1)
    if rule is not None and decoder.num_active:
        _block(decoder, chooser, setting, rule, deepest, PROBE_STEPS, PROBE_POSITIONS)
        chooser.acceptance.observe(decoder.runner.log, [len(t) for t in decoder.runner.outputs], greedy,
                                   age=DECAY)  # NOTE: only the deep probe's positions
        prompt_len = statistics.fmean(len(p) for p in decoder.prompt_ids)
        chooser.costs.fit_prefill(deepest, prompt_len, decoder.prefill_seconds)
    if rule is not None and decoder.num_active:
        shallow = chooser.shallow_could_win(options, max(decoder.num_active, 1))
        if shallow is not None:
            _block(decoder, chooser, setting, rule, shallow, PROBE_STEPS)


def generate_auto(
    model,
    tokenizer,
    prompts: list[str] | list[list[int]],
    *,
    mtp=None,
    sampling: SamplingParams = SamplingParams(),
    spec: SpecConfig = SpecConfig(AUTO, AUTO),
    seed: int = 0,
    step: int = 0,
    row_ids: list[int] | None = None,
    chooser: AutoChooser | None = None,
) -> tuple[Completions, Decision]:
    """``generate`` with the mode and/or K chosen within the call (``_probe``, ``AutoChooser.should_probe``).

    Args:
        spec: mode and/or speculate_k ``"auto"``, its other fields as for ``generate`` (as are the other arguments).
        chooser: the run's models and probe schedule; None: a fresh one that learns nothing after its decision.

    Returns:
        ``(result, decision)``: the call's completions (probe tokens kept), and the decision with its measured tok/s.
    """
    check_settings(spec, None)
    options = candidates(spec)
    max_k = max(k for _, k in options)
    if max_k and (problem := head_problem(spec.mode, mtp is not None)):
        raise BebopError(problem)
    private = chooser is None
    chooser = chooser if chooser is not None else AutoChooser()
    probe = chooser.should_probe(spec)
    chooser.acceptance.decay(DECAY)
    greedy = sampling.temperature == 0
    setting = (lambda mode, k: dataclasses.replace(spec, mode=mode, speculate_k=max(k, 1)))
    if probe:
        chooser.restart()
        prior = chooser.acceptance.copy()  # the evidence of earlier calls (the deep probe adds to a copy)
        rule = probe_rule(options)
        decision, first = None, (rule, max_k) if rule is not None else options[0]
    else:
        decision = dataclasses.replace(chooser.held, probed=False, measured_tok_s=math.nan)
        first = (decision.mode, decision.speculate_k)
    depth = max_k if probe else decision.speculate_k  # NOTE: a held call never switches: room for its K only
    decoder = Decoder(model, tokenizer, prompts, mtp=mtp if depth else None, sampling=sampling, spec=setting(*first),
                      seed=seed, step=step, row_ids=row_ids, max_speculate_k=depth, time_drafts=probe)
    if probe:
        _probe(decoder, chooser, options, setting, greedy)
        tail = chooser.lengths.rows(decoder.active_lengths(), sampling.max_new_tokens) if decoder.num_active else None
        decision = chooser.choose(options, rows=max(decoder.num_active, 1), tail=tail)
        decoder.set_spec(setting(decision.mode, decision.speculate_k))
    elif decoder.num_active:  # NOTE: the first step also feeds the head the prompt: not in measured_tok_s
        decoder.step()
    start, before, rest = time.perf_counter(), decoder.num_tokens(), []
    while decoder.num_active:
        rest.append(decoder.step())
    if rest:
        decision.measured_tok_s = (decoder.num_tokens() - before) / max(time.perf_counter() - start, 1e-9)
    result = decoder.result()
    if private:  # NOTE: no later call reads this chooser
        return result, decision
    if probe:
        chooser.costs.observe(decision.speculate_k, rest)
        chooser.acceptance = prior  # every drafted position of the call, once (not the probe's twice)
        chooser.settle(decision)
    chooser.acceptance.observe(result.log, result.lengths, greedy, age=DECAY)
    chooser.lengths.add(result.lengths)
    chooser.calls += 1
    return result, decision
