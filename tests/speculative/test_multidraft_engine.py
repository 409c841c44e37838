"""The engine with several chains per row (``SpecConfig.num_drafts``, ``bebop.speculative.multidraft``).

  * literal: the lane path with one chain emits the one-chain path's tokens byte for byte (the cache copies,
    commits and row selection change nothing); T = 0 equals plain greedy; a row's tokens do not depend on
    its batch; settings that cannot run are refused in one line.
  * statistical: the engine end to end on V = 8 models, the attention one and a hybrid (marginals of tokens
    1..3 and the (1, 2) joint against the enumerated plain distribution, α = 1e-4 per check as in
    test_block.py: 3 configs x 4 checks, so an exact engine fails with odds at most 1.2e-3 for a seed picked
    at random; seeds are fixed), and the lossless checks (``bebop.check.lossless``) with multi-draft
    settings on a hybrid family.
"""

import numpy as np
import pytest
import torch

from bebop.check.lossless import MULTI_DRAFT_LOSSLESS_CONFIGS, run_lossless_checks, summarize_checks
from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig, generate
from bebop.speculative.stats import entropy
from bebop.utils.errors import BebopError
from tests.helpers.engine import (
    STAT_PROMPT,
    ToyTokenizer,
    assert_three_tokens_are_plain,
    peaked_model,
    perturbed_head,
    stat_model,
    toy_prompts,
)
from tests.helpers.models import HYBRIDS
from tests.helpers.verification import NUM_ROWS as ENGINE_ROWS
from tests.speculative.test_hybrid import STAT_PROMPTS, STAT_SAMPLES, _stat_hybrid

PROMPTS = (2, 5, 3, 7)


def _decode(spec, temperature=1.0, seed=0, prompts=None, lanes=False, row_ids=None, model=None):
    model = model or peaked_model()
    decoder = Decoder(model, ToyTokenizer(), prompts or toy_prompts(PROMPTS), mtp=perturbed_head(model, 0.3),
                      seed=seed, spec=spec, sampling=SamplingParams(temperature=temperature, max_new_tokens=20),
                      row_ids=row_ids)
    if lanes:  # the multi-draft step with whatever num_drafts the spec has, one chain included
        decoder.runner._speculative_step = decoder.runner._multi_draft_step
    while decoder.num_active:
        decoder.step()
    return decoder.result()


@pytest.mark.parametrize("k", [1, 3])
def test_one_lane_emits_the_one_chain_tokens(k):
    chain = _decode(SpecConfig("rs", k))
    lanes = _decode(SpecConfig("rs", k), lanes=True)
    assert lanes.token_ids == chain.token_ids
    assert lanes.stats.num_accepted_tokens == chain.stats.num_accepted_tokens


@pytest.mark.parametrize("arch", HYBRIDS)
def test_one_lane_emits_the_one_chain_tokens_on_hybrids(arch):
    """Recurrent states and conv windows are copied per lane and the kept lane's become the row's."""
    model = _stat_hybrid(arch)[0]
    chain = _decode(SpecConfig("rs", 3), model=model, prompts=STAT_PROMPTS)
    assert _decode(SpecConfig("rs", 3), lanes=True, model=model, prompts=STAT_PROMPTS).token_ids == chain.token_ids


@pytest.mark.parametrize("arch", ["full"] + HYBRIDS[-1:])
def test_every_kept_token_was_drawn_from_the_models_own_distribution(arch):
    """The engine's p at every kept token (its logged entropy) equals the model's forward over the prompt and
    the completion so far: the kept lane's keys, values and recurrent states are the row's from then on."""
    model = peaked_model() if arch == "full" else _stat_hybrid(arch)[0]
    prompts = toy_prompts(PROMPTS) if arch == "full" else STAT_PROMPTS
    out = _decode(SpecConfig("rs", 3, num_drafts=3), model=model, prompts=prompts)
    kept = out.log.kept(out.lengths)
    assert (out.stats.num_accepted_tokens or 0) > 0
    for row, completion in enumerate(out.token_ids):
        ids = torch.tensor([out.prompt_ids[row] + completion])
        with torch.no_grad():
            probs = torch.softmax(model(input_ids=ids).logits[0].double(), -1)  # T = 1, no filters
        n = len(out.prompt_ids[row])
        expected = entropy(probs[n - 1: n - 1 + len(completion)]).numpy()
        mine = kept.token_row == row
        got = kept.token_entropy[mine][np.argsort(kept.token_offset[mine])]
        np.testing.assert_allclose(got, expected, atol=1e-4, err_msg=f"row {row}")


def test_greedy_with_several_drafts_equals_plain_greedy():
    assert _decode(SpecConfig("rs", 3, num_drafts=4), temperature=0).token_ids == \
        _decode(SpecConfig("none"), temperature=0).token_ids


def test_row_output_does_not_depend_on_its_batch():
    prompts = toy_prompts(PROMPTS)
    together = _decode(SpecConfig("rs", 3, num_drafts=3), prompts=prompts)
    alone = _decode(SpecConfig("rs", 3, num_drafts=3), prompts=prompts[2:3], row_ids=[2])
    assert together.token_ids[2] == alone.token_ids[0]
    assert together.token_ids != _decode(SpecConfig("rs", 3, num_drafts=2), prompts=prompts).token_ids


@pytest.mark.parametrize("spec,message", [
    (SpecConfig("to", 3, num_drafts=2), "needs mode rs and verify token"),
    (SpecConfig("rs", 3, verify="block", num_drafts=2), "needs mode rs and verify token"),
    (SpecConfig("rs", 3, num_drafts=0), "num_drafts must be an integer"),
    (SpecConfig("rs", 3, num_drafts=2.0), "num_drafts must be an integer"),
])
def test_settings_that_cannot_run_are_refused(spec, message):
    with pytest.raises(BebopError, match=message):
        _decode(spec)


ENGINE_CONFIGS = {  # n, K, sampling
    "n2-k2-t1": (2, 2, SamplingParams(temperature=1.0, max_new_tokens=3)),
    "n3-k3-t0.7-topk-topp": (3, 3, SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(ENGINE_CONFIGS) + ["nemotron_h-n2-k2-t1"])
def test_engine_matches_exact_distribution(config):
    """On the attention model, and on a hybrid (whose lanes copy recurrent states and conv windows)."""
    n, k, sampling = ENGINE_CONFIGS[config.removeprefix("nemotron_h-")]
    model, head = _stat_hybrid("nemotron_h") if config.startswith("nemotron_h") else stat_model()
    out = generate(model, ToyTokenizer(), [STAT_PROMPT] * ENGINE_ROWS, mtp=head, sampling=sampling,
                   spec=SpecConfig("rs", k, num_drafts=n), seed=1)
    assert len(out.token_ids) == ENGINE_ROWS
    assert_three_tokens_are_plain(model, out, sampling, config)


def test_several_drafts_accept_more_than_one_chain():
    """Same rows, same head: 4 chains accept more drafts per verify step than one (the head's α ≈ 0.5)."""
    model, head = stat_model()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12)
    one, four = (generate(model, ToyTokenizer(), [STAT_PROMPT] * 400, mtp=head, sampling=sampling,
                          spec=SpecConfig("rs", 2, num_drafts=n), seed=3).stats for n in (1, 4))
    assert four.accept_length > one.accept_length + 0.1


def test_lossless_checks_pass_on_a_hybrid():
    model, head = _stat_hybrid("nemotron_h")
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=STAT_SAMPLES, seed=0, prompts=STAT_PROMPTS,
                                 configs=MULTI_DRAFT_LOSSLESS_CONFIGS)
    assert checks and summarize_checks(checks).passed
