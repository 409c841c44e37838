"""Tests for bebop.check.lossless: the harness passes an exact engine and catches broken ones.

The harness's own statistics: ``chi2_sf`` and ``two_sample_chi2`` against scipy, the pooling of
rare cells by hand. End to end on a tiny model (V = 8): with alpha = 3e-4 and the 73 default checks,
an exact engine fails ``test_exact_engine_passes`` with odds 1 - (1 - 3e-4)^73 ~= 2.2% for a seed
picked at random; the seed is fixed, so a given checkout passes or fails deterministically. The
broken sampler (recovered tokens drawn from p instead of max(0, p - q)) and the broken rollback (a
rejected draft's KV entry kept from the second verify step on) must give p-values below
BROKEN_P_VALUE, which an exact sampler reaches with odds 1e-12 per check.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
import scipy.stats
import torch

from bebop.speculative import sampling, target
from bebop.check import lossless
from bebop.check.lossless import (
    BLOCK_LOSSLESS_CONFIGS,
    ENDED,
    LOSSLESS_CONFIGS,
    LosslessConfig,
    chi2_sf,
    false_alarm_odds,
    format_lossless_table,
    pool_rare_cells,
    run_lossless_checks,
    summarize_checks,
    two_sample_chi2,
)
from bebop.utils.errors import BebopError
from tests.helpers.engine import ToyTokenizer, peaked_model, perturbed_head

NUM_SAMPLES = 3000  # rows per sample on the tiny model: ~33k rows of up to 12 tokens for the 7 default configs
NUM_SAMPLES_BROKEN = 10_000  # one config: 2 runs; enough that a broken sampler gives p < 1e-12
PROMPTS = [[3], [5, 1], [2, 2, 7, 4]]  # the first is tested; the others have other lengths (padding)
BROKEN_P_VALUE = 1e-12  # a broken sampler must be this clear, far below any alpha
LEAK_ROOM = 64  # extra cache positions for the leaked entries of the broken-rollback engine


def _tiny():
    model = peaked_model(vocab_size=8, hidden_size=16, num_layers=1)
    return model, perturbed_head(model, 0.3)


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
    assert lossless._leading_tokens([4, 1], 3) == (4, 1, ENDED)
    assert lossless._leading_tokens([4, 1, 5, 6], 3) == (4, 1, 5)


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


def _recover_from_p(target_probs, draft_tokens, draft_probs=None):
    """A broken verifier: the token after a rejection is drawn from p, not from max(0, p - q)."""
    return target_probs.to(sampling.compute_dtype(target_probs, draft_probs))


@pytest.mark.parametrize("config", [LosslessConfig("rs", 3, 1.0), LosslessConfig("to", 1, 0.7, batch_mix=True)])
def test_broken_sampler_fails(config, monkeypatch):
    monkeypatch.setattr(sampling, "recovery_weights", _recover_from_p)
    model, head = _tiny()
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES_BROKEN, seed=0,
                                 prompts=PROMPTS, configs=(config,))
    table = format_lossless_table(checks)
    assert [c.tokens for c in checks] == [(i,) for i in range(1, config.num_tokens + 1)] + [config.joint_pair]
    assert checks[0].passed, table  # token 1 never goes through verification
    assert min(c.p_value for c in checks[1:]) < BROKEN_P_VALUE, table
    assert "FAIL" in table and not summarize_checks(checks).passed


def _context_model():
    """The tiny model with attention weights drawn at std 0.6, so p depends on the whole context: at the
    default init (std 0.02) the model is nearly a Markov chain and a stale KV entry changes nothing."""
    model, head = _tiny()
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "self_attn" in name and weight.dim() == 2:
                weight.copy_(0.6 * torch.randn(weight.shape, generator=g))
    return model, head


def _break_rollback(monkeypatch):
    """From the second verify step on, a row that rejected a draft keeps that draft's KV entry in the
    target's cache (one more committed position than it emitted), as a faulty rollback would."""
    init = target.Target.__init__

    def patched(self, model, batch_size, max_len, **kwargs):
        init(self, model, batch_size, max_len + LEAK_ROOM, **kwargs)
        cache, commit, calls = self.cache, self.cache.commit, []

        def leaky_commit(num_kept):
            calls.append(num_kept)
            if len(calls) >= 3:  # 1 = prefill, 2 = the first verify step (left intact)
                num_kept = [min(n + 1, cache._write_index.shape[1]) for n in num_kept]
            commit(num_kept)

        cache.commit = leaky_commit

    monkeypatch.setattr(target.Target, "__init__", patched)


@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("config", [LosslessConfig("to", 1, 0.7), LosslessConfig("rs", 1, 0.7)])
def test_rollback_defect_shows_only_past_the_first_three_tokens(config, broken, monkeypatch):
    """The broken engine passes every check on tokens 1-3 (all the old harness compared) and fails the
    deeper ones; the real engine passes them all (false-alarm odds 1 - (1 - 3e-4)^7 = 0.2% per config)."""
    if broken:
        _break_rollback(monkeypatch)
    model, head = _context_model()
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
    """``--verify block``: the exact engine passes BLOCK_LOSSLESS_CONFIGS (false-alarm odds 1 - (1 - 3e-4)^49
    = 1.5% for a seed picked at random); the block correction dropped from the residual (thresholds and
    emitted token) fails with p below BROKEN_P_VALUE."""
    from bebop.speculative import block

    model, head = _tiny()
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES, seed=0, prompts=PROMPTS,
                                 configs=BLOCK_LOSSLESS_CONFIGS)
    assert len(checks) == 49 and all(" block " in c.name for c in checks)
    assert summarize_checks(checks).passed, format_lossless_table(checks)
    monkeypatch.setattr(block, "block_residual", lambda p, q, w: (p.double() - q.double()).clamp_min(0.0))
    broken = run_lossless_checks(model, ToyTokenizer(), head, num_samples=NUM_SAMPLES_BROKEN, seed=0,
                                 prompts=PROMPTS, configs=BLOCK_LOSSLESS_CONFIGS[:1])
    assert min(c.p_value for c in broken) < BROKEN_P_VALUE, format_lossless_table(broken)


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
