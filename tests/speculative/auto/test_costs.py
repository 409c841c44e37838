"""Tests for bebop.speculative.auto.costs: the step-cost model on synthetic timings.

What pins it: c_verify(K) as a weighted line through the timed depths (the plain step its K = 0 point
when one drafted depth is timed, else the prefill's slope), drafting as d_0 + K c_draft, blocks weighed
by their timed steps, the floor at a plain step, and a plain step never priced from drafted steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from bebop.speculative.auto import costs as auto
from bebop.speculative.auto.acceptance import Acceptance
from bebop.speculative.auto.chooser import predict
from bebop.speculative.auto.costs import StepCosts


def test_step_costs_by_hand():
    costs = StepCosts(seconds={0: 0.004, 1: 0.009, 4: 0.016}, draft_s=0.002)  # the docstring's example
    assert costs.verify_seconds(2) == pytest.approx(0.007 + 1 / 3 * 1e-3)
    assert costs.step_seconds(2) == pytest.approx(0.004 + 0.007 + 1 / 3 * 1e-3)
    assert costs.step_seconds(4) == 0.016 and costs.step_seconds(0) == 0.004
    one = StepCosts(seconds={4: 0.014}, draft_s=0.002)  # one probed depth, nothing else: c_verify constant
    assert one.step_seconds(2) == pytest.approx(0.006 + 2 * 0.002)
    with_plain = StepCosts(seconds={0: 0.004, 4: 0.014}, draft_s=0.002)  # the plain step is c_verify(0)
    assert with_plain.verify_seconds(2) == pytest.approx(0.005)  # the line through 4 ms at 0 and 6 ms at 4
    one.fit_prefill(4, prompt_len=10, prefill_s=0.009)  # 3 ms more than c_verify(4) for 5 more tokens
    assert one.prefill_slope == pytest.approx(0.0006) and one.verify_seconds(2) == pytest.approx(0.0048)
    one.fit_prefill(4, prompt_len=4, prefill_s=0.009)  # a prompt shorter than a verify pass: no change
    assert one.prefill_slope == pytest.approx(0.0006)
    assert StepCosts(seconds={0: 0.004, 3: 0.01}).step_seconds(2) is None  # drafting never timed
    observed = StepCosts()
    observed.observe(4, [(8, 0.010, 0.004), (8, 0.012, 0.004), (5, 0.020, 0.008)])
    assert observed.seconds == {4: pytest.approx(0.012)} and observed.draft_s == pytest.approx(0.001)
    weighted = StepCosts(seconds={1: 0.009, 2: 0.012, 4: 0.016}, weights={1: 10.0, 2: 1.0, 4: 1.0}, draft_s=0.002)
    slope, intercept = np.polyfit([1, 2, 4], [0.007, 0.008, 0.008], 1, w=np.sqrt([10.0, 1.0, 1.0]))
    assert weighted.verify_seconds(3) == pytest.approx(intercept + 3 * slope)  # depth 1's many steps pull the line
    # drafting = a part paid once per step (the head's pass over what the last step left pending) + K chained steps
    drafts = StepCosts()
    drafts.observe(1, [(64, 0.011, 0.0019)] * 3)
    assert (drafts.draft_fixed, drafts.draft_s) == (0.0, pytest.approx(0.0019))  # one depth: proportional
    drafts.observe(4, [(64, 0.019, 0.0059)] * 3)
    assert drafts.draft_fixed == pytest.approx(0.0019 - 0.004 / 3) and drafts.draft_s == pytest.approx(0.004 / 3)
    assert drafts.step_seconds(2) == pytest.approx(drafts.verify_seconds(2) + drafts.draft_fixed + 2 * drafts.draft_s)
    assert drafts.verify_seconds(1) == pytest.approx(0.011 - 0.0019) and drafts.verify_seconds(4) == pytest.approx(0.019 - 0.0059)
    assert auto._line([(1, 0.001, 1.0), (4, 0.008, 1.0)], drafting=True)[0] == 0.0  # never a negative fixed part
    observed.observe(4, [(8, 0.017, 0.004)])  # a second block: each block weighs its timed steps
    assert observed.seconds[4] == pytest.approx((3 * 0.012 + 0.017) / 4) and observed.weights[4] == 4
    assert observed.draft_s == pytest.approx(0.001)


def test_a_verify_pass_costs_at_least_a_plain_step():
    """c_verify(K) from the line through the drafted depths is floored at a plain step's cost."""
    costs = StepCosts()
    costs.observe(0, [(16, 0.006, 0.0)] * 4)
    costs.observe(3, [(16, 0.010, 0.002)] * 4)
    costs.observe(4, [(16, 0.0125, 0.0025)] * 4)  # c_verify 8, 10 ms at K = 3, 4: 2 ms a depth
    line = 0.008 - 2 * 0.002  # c_verify(1) on the line: 4 ms, below a plain step's 6 ms
    assert costs.verify_seconds(1) == pytest.approx(0.006) and costs.verify_seconds(1) > line
    assert costs.verify_seconds(2) == pytest.approx(0.006)  # 6 ms on the line: the floor
    assert costs.verify_seconds(4) == pytest.approx(0.010)


def test_a_plain_step_is_never_priced_from_drafted_steps():
    # c_verify(K) does not bound a plain step (it was once taken as a lower bound: at B = 64 here a
    # plain step costs ~0.6 c_verify(1), and plain decoding was never probed where it was best)
    assert StepCosts(seconds={4: 0.014}, draft_s=0.002).step_seconds(0) is None
    assert predict("none", 0, Acceptance(), StepCosts(seconds={4: 0.014}, draft_s=0.002), rows=4) == 0.0
