"""Tests for bebop.check.reference: plain sampling against the model's own forward pass.

The statistic: with equal rows it is Pearson's goodness-of-fit statistic (scipy), and over 400
simulated runs with heterogeneous rows its p-values are uniform (Kolmogorov-Smirnov at
KS_ALPHA = 1e-3: a correct statistic fails with odds 1e-3 for a seed picked at random; the seed is
fixed). End to end on tiny sliding-window models with attention weights at the usual 1/sqrt(fan-in)
scale (the default 0.02 init makes attention nearly uniform, so a window barely matters): the fixed
engine passes every check (alpha = 1e-3, 4 checks: false-alarm odds 0.4% for a random seed), and
the engine with its window ignored fails the long-prompt checks with p < BROKEN_P_VALUE while the
speculative-vs-plain lossless checks, sharing the defect, still pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.stats
import torch

from bebop.cli import main
from bebop.mtp import MtpHead
from bebop.check import lossless
from bebop.speculative.kv_cache import RaggedKVCache
from bebop.check.lossless import LOSSLESS_CONFIGS, LosslessConfig, run_lossless_checks
from bebop.check.reference import conditional_chi2, reference_prompts, run_reference_checks
from tests.helpers.cli import save_model_dir
from tests.helpers.models import tiny_model
from tests.helpers.engine import ToyTokenizer, perturbed_head

WINDOW = 8
PROMPTS = [[3], [5, 1], [2, 2, 7, 4]]
NUM_SAMPLES = 2000  # rows per check: a second or so per check on the tiny models
ALPHA = 1e-3
KS_ALPHA = 1e-3
BROKEN_P_VALUE = 1e-12  # an ignored window must be this clear


def sensitive_model(arch: str, sliding_window: int | None = WINDOW, vocab_size: int = 8):
    """A tiny model whose matrices are N(0, 1/fan-in): attention, hence the window, matters."""
    model = tiny_model(arch, vocab_size=vocab_size, hidden_size=16, num_layers=2, sliding_window=sliding_window)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[1] ** 0.5)
    return model


def _ignore_window(monkeypatch):
    """The engine before the sliding-window fix: every layer gets a full causal mask."""
    full = RaggedKVCache.attention_bias
    monkeypatch.setattr(RaggedKVCache, "attention_bias",
                        lambda self, valid_new=None, window=None: full(self, valid_new))


def test_equal_rows_give_pearson():
    rng = np.random.default_rng(0)
    p = np.array([0.4, 0.3, 0.2, 0.1])
    tokens = rng.choice(4, size=3000, p=p)
    statistic, dof = conditional_chi2(torch.tensor(tokens), torch.tensor(p).expand(3000, 4))
    ref = scipy.stats.chisquare(np.bincount(tokens, minlength=4), 3000 * p)
    assert np.isclose(statistic, ref.statistic, rtol=1e-9) and dof == 3


def test_rare_tokens_are_pooled():
    probs = torch.tensor([[0.5, 0.499, 0.001]]).expand(1000, 3)  # the last token expects 1 count
    statistic, dof = conditional_chi2(torch.zeros(1000, dtype=torch.long), probs)
    assert dof == 1 and statistic > 900  # all 1000 draws in the first cell, 500 expected
    assert conditional_chi2(torch.zeros(10, dtype=torch.long), torch.ones(10, 1)) == (0.0, 0)


def test_heterogeneous_rows_are_calibrated():
    rng = np.random.default_rng(1)
    p_values = []
    for _ in range(400):
        probs = rng.dirichlet(np.ones(4) * 2, size=500)  # (N, V): every row its own distribution
        tokens = np.array([rng.choice(4, p=row) for row in probs])
        statistic, dof = conditional_chi2(torch.tensor(tokens), torch.tensor(probs))
        p_values.append(lossless.chi2_sf(statistic, dof))
    assert scipy.stats.kstest(p_values, "uniform").pvalue > KS_ALPHA


def test_reference_prompts():
    mistral = sensitive_model("mistral")
    tested, long = reference_prompts(mistral, ToyTokenizer(eos_token_id=7), PROMPTS)
    assert tested == [3] and len(long) == 2 * WINDOW + 1 and long[-1:] == [3] and 7 not in long
    assert reference_prompts(sensitive_model("llama", None), ToyTokenizer(), PROMPTS) == [[3]]


@pytest.mark.parametrize("arch", ["mistral", "gemma2"])
def test_exact_engine_passes(arch):
    checks = run_reference_checks(sensitive_model(arch), ToyTokenizer(), PROMPTS, NUM_SAMPLES, 0, ALPHA,
                                  LOSSLESS_CONFIGS)
    assert len(checks) == 4  # 2 prompts x T in (1, 0.7)
    assert all(c.passed and c.dof > 0 for c in checks), lossless.format_lossless_table(checks)


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_ignored_window_fails_here_but_not_the_lossless_checks(arch, monkeypatch):
    _ignore_window(monkeypatch)
    model = sensitive_model(arch)
    checks = run_reference_checks(model, ToyTokenizer(), PROMPTS, NUM_SAMPLES, 0, ALPHA, LOSSLESS_CONFIGS[:1])
    table = lossless.format_lossless_table(checks)
    assert checks[0].passed, table  # the short prompt never reaches the window
    assert checks[1].p_value < BROKEN_P_VALUE, table
    # Speculative and plain sampling share the defect, so comparing them finds nothing, even past the window.
    long = reference_prompts(model, ToyTokenizer(), PROMPTS)[1]
    shared = run_lossless_checks(model, ToyTokenizer(), perturbed_head(model, 0.3), num_samples=NUM_SAMPLES,
                                 prompts=[long], configs=(LosslessConfig("rs", 3, 1.0),))
    assert all(c.passed for c in shared), lossless.format_lossless_table(shared)


@pytest.mark.parametrize("broken", [False, True])
def test_check_lossless_command_fails_an_ignored_window(broken, tmp_path, monkeypatch, capsys):
    model = sensitive_model("mistral", vocab_size=16)
    save_model_dir(tmp_path / "model", model)
    MtpHead(model).save_pretrained(tmp_path / "head")
    (tmp_path / "prompts.txt").write_text("a b c\nd e\nf g h i\n")
    if broken:
        _ignore_window(monkeypatch)
    status = main(["check-lossless", "--model", str(tmp_path / "model"), "--mtp", str(tmp_path / "head"),
                   "--prompts", str(tmp_path / "prompts.txt"), "--samples", "1000"])
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("|") and "plain vs model forward" in line]
    assert len(lines) == 4 + 2 * broken  # the failing checks' retests: failed again on fresh samples
    assert sum("(retest)" in line for line in lines) == 2 * broken
    failed = [line for line in lines if "FAIL" in line]
    assert (status, bool(failed)) == ((1, True) if broken else (0, False)), "\n".join(lines)
    assert all("long prompt" in line for line in failed)
    assert ("FAILING configurations" in out) == broken  # the summary names what failed


@pytest.mark.parametrize("rows_per_call", [None, 7])
def test_reduced_cells_give_the_full_vocabulary_statistic(rows_per_call, monkeypatch):
    """The memory-bounded path (expected-count cells + one rest cell, the logits of the generated positions
    only, in calls of 7 rows when LOGITS_ELEMENTS says so) gives conditional_chi2's value on full rows."""
    from bebop.check import reference
    from bebop.speculative.engine import SamplingParams, SpecConfig, generate

    if rows_per_call is not None:
        monkeypatch.setattr(reference, "LOGITS_ELEMENTS", rows_per_call * reference.REF_TOKENS * 32)
    model = tiny_model("qwen3", vocab_size=32)
    prompt = [3, 4, 5]
    out = generate(model, ToyTokenizer(), [prompt] * 300, sampling=SamplingParams(max_new_tokens=reference.REF_TOKENS),
                   spec=SpecConfig("none"), seed=5)
    draws = reference._reduced_draws(model, out.token_ids, prompt, 1.0)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + c for c in out.token_ids])).logits
    for i, (cells, probs) in enumerate(draws):
        full = torch.softmax(logits[:, len(prompt) - 1 + i].double(), -1)
        tokens = torch.tensor([c[i] for c in out.token_ids])
        want, want_dof = reference.conditional_chi2(tokens, full)
        got, got_dof = reference.conditional_chi2(cells, probs)
        assert got_dof == want_dof and abs(got - want) < 1e-6 * max(1.0, want)
