"""Synthetic models for the auto wing's tests: acceptance tables, step costs, a chooser with history."""

from __future__ import annotations

import numpy as np

from bebop.speculative.auto.acceptance import Acceptance
from bebop.speculative.auto.chooser import AutoChooser, candidates
from bebop.speculative.auto.costs import StepCosts
from bebop.speculative.auto.tail import Rows
from bebop.speculative.engine import SpecConfig

ALL = candidates(SpecConfig("auto", "auto"))  # none, to1..4, rs1..4


def acceptance_of(rs: list[float], to: list[float], weight: float = 100.0) -> Acceptance:
    """A table whose depth j has ``weight`` positions at alpha_RS rs[j], alpha_TO to[j]."""
    acc = Acceptance()
    for j, (a_rs, a_to) in enumerate(zip(rs, to), start=1):
        acc.add(j, weight, a_rs * weight, a_to * weight)
    return acc


def costs_of(plain: float, a: float, b: float, ks=(1, 4)) -> StepCosts:
    """Steps of a + b K seconds, b of them drafting (c_draft = b, c_verify = a)."""
    return StepCosts(seconds={0: plain, **{k: a + b * k for k in ks}}, draft_s=b)


def with_history() -> AutoChooser:
    """A chooser with earlier calls' models: plain timed at 1 ms (3 rows), rs3 at 9 ms, lengths seen."""
    chooser = AutoChooser()
    chooser.costs.observe(0, [(3, 0.001, 0.0)])
    chooser.costs.observe(3, [(3, 0.009, 0.003)] * 2)
    chooser.lengths.add([5, 7])
    return chooser


def known_rows(done, left) -> Rows:
    """Rows whose remaining tokens are known (``left[i]`` after ``done[i]``): point masses, grouped."""
    done, left = np.asarray(done, dtype=np.int64), np.maximum(np.asarray(left, dtype=np.int64), 1)
    span = int(left.max(initial=1)) + 1
    pairs, count = np.unique(done * span + left, return_counts=True)
    probs = np.zeros((len(pairs), span))
    probs[np.arange(len(pairs)), pairs % span] = 1.0
    return Rows(pairs // span, count, probs)
