"""Tests for the engine on hybrid models: recurrent layers' state is rolled back exactly
(bebop.speculative.state_cache), by snapshots and by replay (bebop.speculative.replay).

Every engine test runs under both rollbacks (the ``rollback`` fixture: auto with SNAPSHOT_BUDGET set
so that every verify pass takes the one named).

What pins it, on tiny models of each hybrid family (Qwen3.5, Qwen3.5-MoE and Qwen3-Next: Gated DeltaNet
and full attention, 3:1; NemotronH: Mamba2, attention and MLP blocks):
  * the engine's target logits over a ragged prefill, verify passes whose rows keep 1..4 tokens, and a
    plain step equal the model's own forward (test_attention.py's check, run on every supported family,
    here again with every pass replayed);
  * at temperature 0, ``to``, ``rs`` and ``rs`` with block verification give plain greedy's tokens, which
    are HF ``generate(do_sample=False)``'s;
  * a wrong rollback (each row's state and window left at the end of the verify pass) fails both
    checks; a wrong replay (every position of the pass replayed, the windows kept right) fails the
    logits check;
  * a row's sampled tokens do not depend on the rows beside it, which end and leave the batch (their
    states move), and switching mode and K between steps (auto mode) keeps greedy's tokens;
  * ``RowStates`` by hand: each row's window and state after a verify pass are the ones at its kept length;
  * statistical: the lossless checks (``bebop.check.lossless``: speculative against plain
    sampling, rs token-wise and block, T = 1 and 0.7) pass on each family (23 checks at alpha = 3e-4: a
    correct engine fails one family with odds 0.7% for a seed picked at random; the seeds are fixed), and
    fail, with a p-value below 1e-12, when the rollback leaves each row's state and window at the pass's
    end (under replay: the replay runs every position). A wrong replay of the state alone moves the
    distribution too little for these sample sizes (p = 0.014 at 4,000 samples on the Qwen3.5 one): the
    logits check is its test.
"""

from __future__ import annotations

import pytest
import torch

from bebop.mtp import MtpHead
from bebop.check.lossless import LosslessConfig, run_lossless_checks, summarize_checks
from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig, generate
from bebop.speculative import state_cache
from bebop.speculative.state_cache import RowStates
from tests.helpers.models import HYBRIDS, tiny_model
from tests.helpers.engine import VOCAB, ToyTokenizer, perturbed_head, toy_prompts
from tests.speculative.test_attention import target_logits_match

NEW_TOKENS = 16
PROMPT_LENGTHS = (5, 12, 2)
STAT_SAMPLES = 1000  # rows per sample of each lossless check
BROKEN_SAMPLES = 4000  # enough that the wrong rollback gives p < BROKEN_P_VALUE
STAT_PROMPTS = [[3], [5, 1], [2, 2, 7, 4]]  # the first is tested; the others are mixed into its batch
STAT_CONFIGS = (LosslessConfig("rs", 3, 1.0, batch_mix=True), LosslessConfig("rs", 2, 0.7, verify="block"))
BROKEN_P_VALUE = 1e-12  # a broken rollback must be this clear, far below any alpha


ROLLBACKS = ["snapshot", "replay"]


@pytest.fixture(params=ROLLBACKS)
def rollback(request, monkeypatch):
    """The rollback every verify pass of the test takes: auto's SNAPSHOT_BUDGET set to always or never pass."""
    monkeypatch.setattr(state_cache, "SNAPSHOT_BUDGET", 0 if request.param == "replay" else 2**62)
    return request.param


def hybrid_model(arch: str, **kwargs):
    """``tiny_model`` whose recurrent state moves its logits: a tiny NemotronH's Mamba2 state is ~1e-6 at the
    family's initialisation (dt_bias from dt in [0.001, 0.1], small in_proj weights), too small for the
    logits checks to see a wrong state, so it gets dt_bias 1 (the mixer's own default) and 10x in_proj weights."""
    model = tiny_model(arch, **kwargs)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if name.endswith("mixer.dt_bias"):
                weight.fill_(1.0)
            elif ".mixer.in_proj." in name:
                weight.mul_(10.0)
    return model


def _greedy(model, prompts, head=None, spec=SpecConfig(), eos=None, max_new_tokens=NEW_TOKENS):
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    return generate(model, ToyTokenizer(eos), prompts, mtp=head, sampling=sampling, spec=spec)


def _hf_greedy(model, prompt: list[int]) -> list[int]:
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def _last_state_commit(monkeypatch) -> None:
    """A wrong rollback: after a verify pass every row keeps the state of the pass's last position."""
    commit = RowStates.commit
    monkeypatch.setattr(RowStates, "commit", lambda self, kept: commit(self, [self._record or n for n in kept]))


def _replay_past_kept(monkeypatch) -> None:
    """A wrong replay: every row's state is replayed over all positions of the pass (its window stays right)."""
    replay = RowStates._replay
    monkeypatch.setattr(RowStates, "_replay", lambda self, kept: replay(self, torch.full_like(kept, self._record)))


WRONG_ROLLBACKS = {"snapshot": [_last_state_commit], "replay": [_last_state_commit, _replay_past_kept]}


@pytest.mark.parametrize("arch", HYBRIDS)
def test_greedy_speculative_equals_plain_and_hf(arch, rollback):
    model = hybrid_model(arch, vocab_size=VOCAB)
    head = MtpHead(model)
    prompts = toy_prompts(PROMPT_LENGTHS)
    plain = _greedy(model, prompts)
    assert plain.token_ids == [_hf_greedy(model, p) for p in prompts]
    for spec in (SpecConfig("to", 3), SpecConfig("rs", 3), SpecConfig("rs", 3, verify="block"), SpecConfig("rs", 1)):
        out = _greedy(model, prompts, head, spec)
        assert out.token_ids == plain.token_ids, spec
        # Only meaningful if rows kept different numbers of drafts: some accepted, some rejected.
        assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens, spec


@pytest.mark.parametrize("arch", HYBRIDS)
def test_the_engine_logits_equal_the_models_forward_under_replay(arch, monkeypatch):
    """test_attention.py's check (there under snapshots, auto's choice at these sizes), every pass replayed."""
    monkeypatch.setattr(state_cache, "SNAPSHOT_BUDGET", 0)
    assert target_logits_match(hybrid_model(arch, vocab_size=VOCAB))


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_forced_replay_gives_greedy_tokens(arch):
    model = hybrid_model(arch, vocab_size=VOCAB)
    prompts = toy_prompts(PROMPT_LENGTHS)
    out = _greedy(model, prompts, MtpHead(model), SpecConfig("rs", 3, recurrent_rollback="replay"))
    assert out.token_ids == _greedy(model, prompts).token_ids


@pytest.mark.parametrize("arch", HYBRIDS)
def test_a_wrong_rollback_fails_these_checks(arch, rollback):
    model = hybrid_model(arch, vocab_size=VOCAB)
    head = MtpHead(model)
    prompts = toy_prompts(PROMPT_LENGTHS + (7,))
    plain = _greedy(model, prompts, max_new_tokens=24)
    for wrong in WRONG_ROLLBACKS[rollback]:
        with pytest.MonkeyPatch.context() as monkeypatch:
            wrong(monkeypatch)
            assert not target_logits_match(model), wrong.__name__
            if wrong is _last_state_commit:  # NOTE: a wrong state alone moves too few of Qwen3-Next's argmaxes
                out = _greedy(model, prompts, head, SpecConfig("rs", 3), max_new_tokens=24)
                assert out.token_ids != plain.token_ids


@pytest.mark.parametrize("arch", ["qwen3_5_hybrid", "nemotron_h"])
def test_row_output_does_not_depend_on_its_batch(arch, rollback):
    """Row id 5, sampled at T = 1 with rs, gives the same tokens alone and among 7 rows that end at EOS
    earlier (the batch shrinks and rows, states included, move into the finished rows' places)."""
    model = hybrid_model(arch, vocab_size=VOCAB)
    head = MtpHead(model)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24)
    prompt, others = toy_prompts((4,), seed=1)[0], toy_prompts((1, 6, 3, 9, 2, 5, 7), seed=2)
    tokenizer = ToyTokenizer(eos_token_id=2)
    alone = generate(model, tokenizer, [prompt], mtp=head, sampling=sampling, spec=SpecConfig("rs", 3), row_ids=[5])
    batch = others[:3] + [prompt] + others[3:]
    mixed = generate(model, tokenizer, batch, mtp=head, sampling=sampling, spec=SpecConfig("rs", 3),
                     row_ids=[10, 11, 12, 5, 13, 14, 15, 16])
    assert mixed.token_ids[3] == alone.token_ids[0]
    assert len(alone.token_ids[0]) > 8 and min(mixed.lengths) < len(alone.token_ids[0])  # others ended first


@pytest.mark.parametrize("arch", ["qwen3_next_hybrid", "nemotron_h"])
def test_switching_mode_and_k_between_steps_keeps_greedy_tokens(arch, rollback):
    model = hybrid_model(arch, vocab_size=VOCAB)
    head = MtpHead(model)
    prompts = toy_prompts(PROMPT_LENGTHS)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    decoder = Decoder(model, ToyTokenizer(), prompts, mtp=head, sampling=sampling, spec=SpecConfig("none", 3),
                      max_speculate_k=4)
    schedule = [SpecConfig("none", 3), SpecConfig("rs", 4), SpecConfig("to", 1), SpecConfig("rs", 2)]
    step = 0
    while decoder.num_active:
        decoder.set_spec(schedule[step % len(schedule)])
        decoder.step()
        step += 1
    assert decoder.result().token_ids == _greedy(model, prompts).token_ids


def test_row_states_keep_each_rows_state_at_its_kept_length():
    """Two rows, a conv window of 2 inputs and a recurrent state; a verify pass of 3 positions, rows keep 1 and 3."""
    states = RowStates(2, torch.device("cpu"))
    states.begin(2, 2, record=False)  # a prefill of 2 positions
    window = states.update_conv_state(torch.tensor([[[1.0, 2.0]], [[5.0, 6.0]]]), 0, conv_kernel_size=2)
    assert window.tolist() == [[[0, 0, 1, 2]], [[0, 0, 5, 6]]]  # zeros before the first input
    states.update_recurrent_state(torch.tensor([[10.0], [50.0]]), 0)
    states.commit([2, 2])  # not a verify pass: nothing to choose
    states.begin(3, 2, record=True)
    assert states.get_recurrent_states_to_keep(0) == 3
    window = states.update_conv_state(torch.tensor([[[3.0, 4.0, 9.0]], [[7.0, 8.0, 9.0]]]), 0, conv_kernel_size=2)
    assert window.tolist() == [[[1, 2, 3, 4, 9]], [[5, 6, 7, 8, 9]]]
    states.update_recurrent_state([torch.tensor([[11.0], [51.0]]), torch.tensor([[12.0], [52.0]]),
                                   torch.tensor([[13.0], [53.0]])], 0)
    assert states.get_recurrent_state(0).tolist() == [[10], [50]]  # unchanged until the commit
    states.commit([1, 3])
    assert states.get_conv_state(0).tolist() == [[[2, 3]], [[8, 9]]]
    assert states.get_recurrent_state(0).tolist() == [[11], [53]]
    states.select_rows([1])  # row 0 finished
    assert states.get_conv_state(0).tolist() == [[[8, 9]]] and states.get_recurrent_state(0).tolist() == [[53]]


def test_a_verify_pass_without_every_positions_state_is_refused():
    states = RowStates(1, torch.device("cpu"))
    states.begin(3, 1, record=True)
    with pytest.raises(ValueError, match="returned 1 states for a verify pass of 3 positions"):
        states.update_recurrent_state(torch.zeros(1, 2), 0)


def test_a_transformers_without_per_position_states_is_refused_in_one_line(monkeypatch):
    from transformers import cache_utils

    from bebop.utils.errors import BebopError

    monkeypatch.delattr(cache_utils.Cache, "get_recurrent_states_to_keep")  # as in transformers 5.19, vLLM's pin
    with pytest.raises(BebopError, match="per-position recurrent states"):
        _greedy(tiny_model("qwen3_5_hybrid"), toy_prompts((3,)))


def _stat_hybrid(arch: str):
    """A 2-layer hybrid (a recurrent layer, then full attention) with V = 8 whose p is peaked and depends on
    the recurrent state (its recurrent layer's weights have std 0.6), and a jittered head: rejections are common."""
    model = hybrid_model(arch, vocab_size=8, hidden_size=16, layer_types=["linear_attention", "full_attention"])
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for module, std in ((model.get_input_embeddings(), 1.0), (model.get_output_embeddings(), 0.3)):
            module.weight.copy_(std * torch.randn(module.weight.shape, generator=g))
        for name, weight in model.named_parameters():
            if ("linear_attn" in name or "mixer" in name) and weight.dim() == 2:
                weight.copy_(0.6 * torch.randn(weight.shape, generator=g))
    return model, perturbed_head(model, 0.3)


@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a != "nemotron_h" else a for a in HYBRIDS])
def test_sampling_is_lossless_on_each_family(arch, rollback):
    """About 10 s per Gated DeltaNet family (slow), 4 s for NemotronH."""
    model, head = _stat_hybrid(arch)
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=STAT_SAMPLES, seed=0, prompts=STAT_PROMPTS,
                                 configs=STAT_CONFIGS)
    assert len(checks) == 23 and summarize_checks(checks).passed


def test_a_wrong_rollback_fails_the_lossless_checks(rollback, monkeypatch):
    model, head = _stat_hybrid("nemotron_h")
    _last_state_commit(monkeypatch)
    checks = run_lossless_checks(model, ToyTokenizer(), head, num_samples=BROKEN_SAMPLES, seed=0,
                                 prompts=STAT_PROMPTS, configs=STAT_CONFIGS[:1])
    assert not summarize_checks(checks).passed and min(c.p_value for c in checks) < BROKEN_P_VALUE
