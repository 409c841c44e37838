"""Filtered drafts (``SpecConfig.filter_drafts``): q is cut by the target's top-k/top-p, output stays exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bebop.speculative.drafter import Drafter
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.speculative.sampling import logits_to_probs
from bebop.speculative.verification import VERIFIERS
from tests.helpers.engine import (
    STAT_PROMPT,
    STAT_VOCAB,
    ToyTokenizer,
    assert_fits,
    exact_joint,
    peaked_model,
    perturbed_head,
    record_blocks,
    stat_model,
    toy_prompts,
)
from tests.helpers.verification import NUM_ROWS

TOP_K = 3  # of VOCAB 32 (and of STAT_VOCAB 8): most of q's mass would fall outside it


def _spy_verify(monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Records (drafts (R, K), q given to verification (R, K, V)) of every verify step."""
    calls = []
    verify = VERIFIERS["token"]

    def spy(p, drafts, q, uniform):
        calls.append((drafts.clone(), q.clone()))
        return verify(p, drafts, q, uniform)

    monkeypatch.setitem(VERIFIERS, "token", spy)  # looked up when the engine's runner is built
    return calls


@pytest.mark.parametrize("filter_drafts", [False, True])
def test_drafts_and_q_are_filtered(filter_drafts, monkeypatch):
    """With ``filter_drafts`` every q row verification sees keeps at most TOP_K tokens (no ties in
    float32 logits of random weights) and every draft lies in its support; without, q is the full softmax."""
    model = peaked_model()
    head = perturbed_head(model, 0.3)
    calls = _spy_verify(monkeypatch)
    sampling = SamplingParams(temperature=1.0, top_k=TOP_K, max_new_tokens=12)
    generate(model, ToyTokenizer(), toy_prompts((2, 5, 9)), mtp=head, sampling=sampling,
             spec=SpecConfig("rs", 3, filter_drafts=filter_drafts), seed=0)
    assert calls
    for drafts, q in calls:
        support = (q > 0).sum(-1)  # (R, K)
        if filter_drafts:
            assert (support <= TOP_K).all()
            assert (q.gather(-1, drafts[..., None]) > 0).all()
        else:
            assert (support > TOP_K).all()
        torch.testing.assert_close(q.sum(-1), torch.ones_like(q[..., 0]))


def test_filtered_q_is_the_target_filter_of_the_draft_logits(monkeypatch):
    """q equals ``logits_to_probs`` (the target's own filter) applied to the head's logits at each depth."""
    model = peaked_model()
    head = perturbed_head(model, 0.3)
    sampling = SamplingParams(temperature=0.7, top_k=5, top_p=0.8, max_new_tokens=6)
    seen = []
    real = Drafter.probs

    def spy(self, logits):
        q = real(self, logits)
        seen.append((logits.clone(), q))
        return q

    monkeypatch.setattr(Drafter, "probs", spy)
    generate(model, ToyTokenizer(), toy_prompts((4,)), mtp=head, sampling=sampling,
             spec=SpecConfig("rs", 2, filter_drafts=True), seed=0)
    assert seen
    for logits, q in seen:
        torch.testing.assert_close(q, logits_to_probs(logits, 0.7, 5, 0.8))


FILTERED_CONFIGS = {  # mode, K, sampling: filtering matters where q is sampled (rs) and is a no-op for to
    "rs-k3-t0.7-topk-topp": ("rs", 3, SamplingParams(temperature=0.7, top_k=TOP_K, top_p=0.9, max_new_tokens=3)),
    "rs-k2-t1-topp": ("rs", 2, SamplingParams(temperature=1.0, top_p=0.6, max_new_tokens=3)),
    "to-k2-t1-topk": ("to", 2, SamplingParams(temperature=1.0, top_k=TOP_K, max_new_tokens=3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(FILTERED_CONFIGS))
def test_filtered_drafts_match_exact_distribution(config, monkeypatch):
    """As ``test_speculative_sampling_matches_exact_distribution``, with ``filter_drafts``: marginals
    of tokens 1-3 and the joint of (1, 2) against the enumerated plain distribution (chi-square, false
    alarm 1e-4 per check, 4 checks per configuration: odds <= 1.2e-3 for the 3 configurations)."""
    mode, k, sampling = FILTERED_CONFIGS[config]
    model, head = stat_model()
    blocks = record_blocks(monkeypatch)
    out = generate(model, ToyTokenizer(), [STAT_PROMPT] * NUM_ROWS, mtp=head, sampling=sampling,
                   spec=SpecConfig(mode, k, filter_drafts=True), seed=1)
    tokens = np.array(out.token_ids)  # (N, 3)
    assert tokens.shape == (NUM_ROWS, 3)
    emitted = np.bincount([len(b) for _, b in blocks], minlength=k + 2)[1:]  # rejections, partial and full blocks
    assert (emitted > 0).all(), emitted
    joint = exact_joint(model, STAT_PROMPT, sampling)
    v = STAT_VOCAB
    for t, marginal in enumerate((joint.sum((1, 2)), joint.sum((0, 2)), joint.sum((0, 1)))):
        assert_fits(np.bincount(tokens[:, t], minlength=v), marginal, f"{config} token {t + 1}")
    assert_fits(np.bincount(tokens[:, 0] * v + tokens[:, 1], minlength=v * v), joint.sum(2), f"{config} tokens (1, 2)")
