"""Tests for bebop.check.lossless: the harness passes an exact engine and catches broken ones.

The harness's own statistics: ``chi2_sf`` and ``two_sample_chi2`` against scipy, the pooling of
rare cells by hand. End to end on a tiny model (V = 8): with alpha = 3e-4, the 73 default checks in
3 events and the retest, an exact engine fails ``test_exact_engine_passes`` with odds at most
``false_alarm_bound`` ~= 1.6e-4 for a seed picked at random; the seed is fixed, so a given checkout
passes or fails deterministically. Every broken sampler of ``tests.check.samplers.BROKEN`` must be
called not lossless, its retest giving p-values below BROKEN_P_VALUE, which an exact sampler reaches
with odds 1e-12 per check. The retest procedure itself is pinned on ``ChainSampler``, an exact sampler
cheap enough to run it hundreds of times.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import scipy.stats
import torch

from bebop.check.config import DEFAULT_NUM_SAMPLES
from bebop.check.verdict import false_alarm_bound, false_alarm_odds, retest_seed
from bebop.check import lossless
from bebop.check.lossless import (
    BLOCK_LOSSLESS_CONFIGS,
    ENDED,
    LOSSLESS_CONFIGS,
    LosslessConfig,
    chi2_sf,
    format_lossless_table,
    pool_rare_cells,
    run_lossless_checks,
    summarize_checks,
    two_sample_chi2,
)
from bebop.utils.errors import BebopError
from tests.check.samplers import (
    BROKEN,
    CHAIN_VOCAB,
    ChainSampler,
    block_without_correction,
    break_rollback,
    context_model,
    recover_from_p,
    tiny_model,
)
from tests.helpers.engine import ToyTokenizer

NUM_SAMPLES = 3000  # rows per sample on the tiny model: ~33k rows of up to 12 tokens for the 7 default configs
NUM_SAMPLES_BROKEN = DEFAULT_NUM_SAMPLES  # the default: every broken sampler must be caught at it
PROMPTS = [[3], [5, 1], [2, 2, 7, 4]]  # the first is tested; the others have other lengths (padding)
BROKEN_P_VALUE = 1e-12  # a broken sampler must be this clear, far below any alpha


def _tiny():
    return tiny_model()


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("dof", [1, 2, 3, 7, 20, 100, 1000])
def test_chi2_sf_matches_scipy(dof):
    for x in [0.0, 1e-8, 0.01, 0.5, dof / 2, dof - 1, dof, dof + 1, 2 * dof, 5 * dof + 40, 20 * dof + 200]:
        expected = scipy.stats.chi2.sf(x, dof)
        got = chi2_sf(x, dof)
        assert math.isclose(got, expected, rel_tol=1e-10, abs_tol=1e-300), (x, dof, got, expected)


def test_chi2_sf_edges():
    assert chi2_sf(0.0, 4) == 1.0 and chi2_sf(-1.0, 4) == 1.0
    assert math.isclose(chi2_sf(3.841458820694124, 1), 0.05, rel_tol=1e-12)
    assert 0.0 <= chi2_sf(1e5, 3) < 1e-300
    with pytest.raises(ValueError, match="dof"):
        chi2_sf(1.0, 0)


def test_two_sample_chi2_matches_scipy_contingency():
    rng = np.random.default_rng(0)
    for _ in range(20):
        num_cells = int(rng.integers(2, 12))
        probs = rng.dirichlet(np.ones(num_cells))
        first = Counter(rng.choice(num_cells, size=int(rng.integers(500, 3000)), p=probs).tolist())
        second = Counter(rng.choice(num_cells, size=int(rng.integers(500, 3000)), p=probs).tolist())
        statistic, dof, p_value = two_sample_chi2(first, second)
        table = np.array(pool_rare_cells(first, second))
        ref = scipy.stats.chi2_contingency(table, correction=False)
        assert math.isclose(statistic, ref.statistic, rel_tol=1e-9) and dof == ref.dof
        assert math.isclose(p_value, ref.pvalue, rel_tol=1e-8, abs_tol=1e-300)
        assert (table.sum(0) * min(table.sum(1)) / table.sum() >= lossless.MIN_EXPECTED).all()


def test_pool_rare_cells_by_hand():
    first, second = Counter(a=50, b=50, c=1), Counter(a=48, b=52, d=2)
    assert pool_rare_cells(first, second) == ([50, 51], [52, 50])
    # Rare cells that together are large enough keep a cell of their own.
    first, second = Counter(a=100, b=3, c=3, d=3), Counter(a=100, b=3, c=3, d=3)
    assert pool_rare_cells(first, second) == ([100, 9], [100, 9])
    assert two_sample_chi2(Counter(a=10), Counter(a=20)) == (0.0, 0, 1.0)  # one cell: nothing to compare


def test_false_alarm_odds():
    assert math.isclose(false_alarm_odds(1e-3, 21), 1 - 0.999**21)
    assert false_alarm_odds(0.5, 1) == 0.5


def test_batch_rows_interleave_other_prompts():
    rows, tested = lossless._batch_rows("t", ["a", "b"], 6, batch_mix=True)
    assert rows == ["t", "t", "a", "t", "t", "b", "t", "t"] and sum(tested) == 6
    assert lossless._batch_rows("t", ["a"], 3, batch_mix=False) == (["t"] * 3, [True] * 3)


def test_leading_tokens_mark_ended_rows():
    assert lossless._leading_tokens([[4, 1], [4, 1, 5, 6]], 3).tolist() == [[4, 1, ENDED], [4, 1, 5]]
    assert lossless._leading_tokens([[4, 1, 5, 6]], 3).tolist() == [[4, 1, 5]]


def test_configs_reach_the_third_verify_step():
    """Prefill gives 1 token and each verify step at most K + 1, so token 3K + 3 needs >= 3 verify steps."""
    for k in (1, 2, 3, 5):
        config = LosslessConfig("rs", k, 1.0)
        assert config.num_tokens == 3 * k + 3 > 1 + 2 * (k + 1)
        assert config.joint_pair == (k + 2, k + 3) and config.joint_pair[1] <= config.num_tokens


# ----------------------------------------------------------------------------- end to end


def test_exact_engine_passes():
    model, head = _tiny()
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES, seed=0, prompts=PROMPTS)
    assert len(checks) == sum(c.num_tokens + 1 for c in LOSSLESS_CONFIGS) == 73
    assert all(c.passed for c in checks), format_lossless_table(checks)
    assert all(c.informative for c in checks)  # every check compared something
    assert summarize_checks(checks).passed
    assert max(c.tokens[-1] for c in checks) == 12 and sum(c.kind == "joint" for c in checks) == 7
    assert {(c.mode, c.speculate_k, c.temperature, c.top_k, c.top_p) for c in checks} >= {
        ("rs", 1, 0.7, 0, 1.0), ("to", 3, 1.0, 0, 1.0), ("rs", 3, 1.0, 20, 0.9)}
    assert any(c.batch_mix for c in checks)


@pytest.mark.parametrize("config", [LosslessConfig("rs", 3, 1.0), LosslessConfig("to", 1, 0.7, batch_mix=True)])
def test_broken_sampler_fails(config, monkeypatch):
    recover_from_p(monkeypatch)
    model, head = _tiny()
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES_BROKEN, seed=0,
                                 prompts=PROMPTS, configs=(config,))
    table, first = format_lossless_table(checks), [c for c in checks if not c.retest]
    assert [c.tokens for c in first] == [(i,) for i in range(1, config.num_tokens + 1)] + [config.joint_pair]
    assert first[0].passed, table  # token 1 never goes through verification
    assert min(c.p_value for c in first[1:]) < BROKEN_P_VALUE, table
    assert "FAIL" in table and not summarize_checks(checks).passed


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("config", [LosslessConfig("to", 1, 0.7), LosslessConfig("rs", 1, 0.7)])
def test_rollback_defect_shows_only_past_the_first_three_tokens(config, broken, monkeypatch):
    """The broken engine passes every check on tokens 1-3 (all the old harness compared) and fails the
    deeper ones; the real engine passes them all (false-alarm odds (7 * 3e-4)^2 = 4.4e-6 per config, retest included)."""
    if broken:
        break_rollback(monkeypatch)
    model, head = context_model()
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES_BROKEN, seed=0,
                                 prompts=PROMPTS, configs=(config,))
    table = format_lossless_table(checks)
    assert all(c.passed for c in checks if c.tokens[-1] <= 3), table
    if not broken:
        assert summarize_checks(checks).passed, table
        return
    deep = [c for c in checks if c.tokens[-1] > 3]
    assert min(c.p_value for c in deep) < BROKEN_P_VALUE, table
    assert not summarize_checks(checks).passed and "FAIL" in table


def test_block_verification_passes_and_a_broken_block_verifier_fails(monkeypatch):
    """``--verify block``: the exact engine passes BLOCK_LOSSLESS_CONFIGS (false-alarm odds at most
    sum_e (3e-4 n_e)^2 = 5.4e-5 over its 4 events, retest included, for a seed picked at random); the block correction dropped from the residual (thresholds and
    emitted token) fails with p below BROKEN_P_VALUE."""
    model, head = _tiny()
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES, seed=0, prompts=PROMPTS,
                                 configs=BLOCK_LOSSLESS_CONFIGS)
    assert len(checks) == 49 and all(" block " in c.name for c in checks)
    assert summarize_checks(checks).passed, format_lossless_table(checks)
    block_without_correction(monkeypatch)
    broken = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES_BROKEN, seed=0,
                                 prompts=PROMPTS, configs=BLOCK_LOSSLESS_CONFIGS[:1])
    assert min(c.p_value for c in broken) < BROKEN_P_VALUE, format_lossless_table(broken)


# ----------------------------------------------------------------------------- the retest procedure

COVERED_ABOVE = ("wrong residual (recovered from p)", "wrong block residual", "off-by-one KV rollback",
                 "stale recurrent state")  # pinned by the tests above and tests/speculative/test_hybrid.py


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in COVERED_ABOVE else n
                                  for n in BROKEN])
def test_every_broken_sampler_is_caught_at_the_default_sample_count(name, monkeypatch):
    """Each broken sampler fails on its first samples and again on the retest's: the verdict is not lossless."""
    broken = BROKEN[name]
    broken.patch(monkeypatch)
    model, head = broken.model()
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=DEFAULT_NUM_SAMPLES, seed=0,
                                 prompts=PROMPTS, configs=broken.configs)
    table = format_lossless_table(checks)
    assert summarize_checks(checks).verdict == "not lossless", table
    assert min(c.p_value for c in checks if c.retest) < BROKEN_P_VALUE, table


class _BrokenUnder(ChainSampler):
    """The exact chain sampler, except that speculative rows at T = 1 drawn under ``seeds`` have their second
    token shifted by one: a failure where and when the test wants it."""

    def __init__(self, seeds: set[int]):
        super().__init__()
        self.seeds, self.calls = seeds, []

    def rollout(self, prompts, sampling, spec, group_size=1, seed=0, step=0, first_row=0):
        self.calls.append((spec.mode, sampling.temperature, seed))
        out = super().rollout(prompts, sampling, spec, group_size, seed, step, first_row)
        if spec.mode != "none" and sampling.temperature == 1.0 and seed in self.seeds:
            for row in out.token_ids:
                row[1] = (row[1] + 1) % CHAIN_VOCAB
        return out


RETEST_CONFIGS = (LosslessConfig("rs", 1, 1.0), LosslessConfig("to", 1, 1.0), LosslessConfig("rs", 1, 0.7))


def _chain_checks(sampler, seed: int = 0, **kwargs):
    return run_lossless_checks(None, None, object(), num_samples=2000, seed=seed, prompts=[[3]], backend=sampler,
                               **{"configs": RETEST_CONFIGS} | kwargs)


def test_a_failure_then_a_pass_on_the_retest_is_lossless():
    """Both T = 1 settings fail against their shared plain sample: one event, retested once, under another seed;
    the T = 0.7 event passed and is not redrawn."""
    sampler = _BrokenUnder({0})
    checks = _chain_checks(sampler)
    summary = summarize_checks(checks)
    assert summary.verdict == "lossless" and summary.cleared == ("rs K=1 T=1", "to K=1 T=1"), format_lossless_table(checks)
    assert sampler.calls[-3:] == [("none", 1.0, retest_seed(0)), ("rs", 1.0, retest_seed(0)), ("to", 1.0, retest_seed(0))]
    assert len(sampler.calls) == 5 + 3 and {c.temperature for c in checks if c.retest} == {1.0}
    assert all(c.passed for c in checks if c.retest) and len([c for c in checks if c.retest]) == 14


def test_two_failures_are_not_lossless():
    checks = _chain_checks(_BrokenUnder({0, retest_seed(0)}))
    summary = summarize_checks(checks)
    assert summary.verdict == "not lossless" and summary.failing == ("rs K=1 T=1", "to K=1 T=1")
    assert format_lossless_table(checks, seed=0).splitlines()[1].startswith("What it means:")


SIM_RUNS = 300  # runs of the procedure on an exact sampler
SIM_ALPHA = 0.02  # per check: high, so first failures are common and the retest's effect is measurable
SIM_CONFIGS = (LosslessConfig("rs", 1, 1.0), LosslessConfig("to", 1, 1.0))  # one event of 14 checks
SIM_QUANTILE = 1 - 1e-4  # a binomial count above this quantile of its bound fails the test (odds 1e-4 if it holds)


def test_the_false_alarm_rate_is_bounded_by_simulation():
    """On an exact sampler, runs with a first failure stay within 1 - (1 - alpha)^m and false verdicts within
    sum_e (alpha n_e)^2, each up to its binomial 1 - 1e-4 quantile over SIM_RUNS runs; the retest clears most
    first failures (a retest that reused the first samples would clear none)."""
    first = false = 0
    for seed in range(SIM_RUNS):
        summary = summarize_checks(run_lossless_checks(None, None, object(), num_samples=300, seed=seed, prompts=[[3]],
                                                       alpha=SIM_ALPHA, configs=SIM_CONFIGS, backend=ChainSampler()))
        first += summary.num_failed > 0
        false += summary.verdict == "not lossless"
    assert summary.event_sizes == (14,)
    assert first <= scipy.stats.binom.ppf(SIM_QUANTILE, SIM_RUNS, false_alarm_odds(SIM_ALPHA, 14))
    assert false <= scipy.stats.binom.ppf(SIM_QUANTILE, SIM_RUNS, false_alarm_bound(SIM_ALPHA, [14]))
    assert false <= first / 4, (first, false)


# ----------------------------------------------------------------------------- report and errors


def test_default_prompts_are_short_task_prompts():
    prompts = lossless.default_prompts()
    assert len(prompts) == lossless.DEFAULT_NUM_PROMPTS and len(set(prompts)) == len(prompts)
    assert all(p.startswith("Q ") and p.count("+") == lossless.DEFAULT_PROMPT_TERMS - 1 for p in prompts)


def test_input_errors():
    model, head = _tiny()
    tok = ToyTokenizer()
    cases = [
        (dict(head=None), "needs an MTP head"),
        (dict(num_samples=10), "num_samples"),
        (dict(alpha=1.5), "alpha"),
        (dict(prompts=[[3]]), "at least two prompts"),
        (dict(prompts=[]), "no prompts"),
        (dict(configs=(LosslessConfig("none", 1, 1.0),)), "bad lossless config"),
        (dict(configs=(LosslessConfig("rs", 1, 0.0),)), "bad lossless config"),
    ]
    for kwargs, message in cases:
        args = dict(head=head, prompts=PROMPTS) | kwargs
        with pytest.raises(BebopError, match=message):
            run_lossless_checks(model, tok, **args)
    # One prompt is fine when no config mixes batches.
    unmixed = LOSSLESS_CONFIGS[:1]
    assert not unmixed[0].batch_mix
    assert len(run_lossless_checks(model, tok, head, num_samples=200, prompts=[[3]], configs=unmixed)) == 13
    with pytest.raises(BebopError, match="unknown check kind"):
        run_lossless_checks(model, tok, head, num_samples=200, prompts=[[3]], configs=unmixed, kinds=("hf",))


def test_each_tested_prompt_gets_its_own_checks():
    """With two tested prompts, each is compared with its own plain sample: the checks of prompt 1 are
    those a run testing prompt 1 alone gives (its runs come first, at the same steps), then prompt 2's."""
    model, head = _tiny()
    tok, config = ToyTokenizer(), LOSSLESS_CONFIGS[:1]
    alone = run_lossless_checks(model, tok, head, num_samples=300, prompts=PROMPTS, configs=config)
    both = run_lossless_checks(model, tok, head, num_samples=300, prompts=PROMPTS, configs=config,
                               num_tested_prompts=2)
    assert len(both) == 2 * len(alone) == 26 and [c.prompt for c in both] == [0] * 13 + [1] * 13
    assert [c.p_value for c in both[:13]] == [c.p_value for c in alone]
    assert both[13].name == "rs K=3 T=1, prompt 2, token 1" and "prompt" not in alone[0].name
    assert len(run_lossless_checks(model, tok, head, num_samples=300, prompts=PROMPTS[:2], configs=config,
                                   num_tested_prompts=5)) == 26  # at most every prompt
    with pytest.raises(BebopError, match="num_tested_prompts must be an integer in \\[1,"):
        run_lossless_checks(model, tok, head, prompts=PROMPTS, configs=config, num_tested_prompts=0)


def test_a_sample_size_beyond_memory_is_refused_before_sampling(monkeypatch):
    from bebop.utils import memory

    model, head = _tiny()
    monkeypatch.setattr(memory, "available_memory", lambda device: 2**30)
    with pytest.raises(BebopError, match=r"10000000 samples per configuration need at least .* GiB of memory; cpu "
                                         r"has 1 GiB free: lower --samples"):
        run_lossless_checks(model, ToyTokenizer(), head, num_samples=10**7, prompts=PROMPTS)
