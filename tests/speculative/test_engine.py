"""Tests for bebop.speculative.engine: speculative generation must be plain generation, only faster.

What pins it:
  * greedy: at temperature 0, modes ``to`` and ``rs`` with K = 1..4 give the tokens of plain greedy
    decoding (mode ``none``) and of HF ``model.generate(do_sample=False)``, on tiny Qwen3, Qwen2 and
    Llama models, for a batch of prompts of different lengths.
  * statistical: 1e5 rows of one prompt through the engine; the first three tokens' marginals and
    the joint of the first two are compared by chi-square with the *exact* plain-sampling
    distribution, enumerated from the model's own logits (V = 8, so V^2 continuations). α = 1e-4
    per check, 4 checks per configuration and 4 configurations: a correct engine fails the file
    with odds at most 16 × 1e-4 = 1.6e-3 (union bound) for a seed picked at random; seeds are
    fixed, so a given checkout passes or fails deterministically.
  * seeded determinism, batch-mix invariance (a row's tokens depend on (seed, step, row id) only),
    EOS/length/stop handling inside accepted blocks, the MTP cache (depth-1 drafts equal the
    head's teacher-forced logits), the statistics' invariants, and input errors.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bebop.mtp import MtpHead
from bebop.speculative import engine
from bebop.speculative.drafter import Drafter
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.utils.errors import BebopError
from tests.helpers.engine import (
    GREEDY_LENGTHS,
    MTP_ATOL,
    STAT_PROMPT,
    STAT_VOCAB,
    VOCAB,
    ToyTokenizer,
    assert_fits,
    exact_joint,
    peaked_model,
    perturbed_head,
    record_blocks,
    stat_model,
    toy_prompts,
)
from tests.helpers.models import tiny_model
from tests.helpers.verification import NUM_ROWS

# ----------------------------------------------------------------------------- greedy


GREEDY_NEW_TOKENS = 20


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_greedy_speculative_equals_plain_and_hf(arch):
    model = tiny_model(arch, vocab_size=VOCAB)
    head = MtpHead(model)  # the warm start: drafts agree with the target often, not always
    prompts = toy_prompts(GREEDY_LENGTHS)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=GREEDY_NEW_TOKENS)
    plain = generate(model, ToyTokenizer(), prompts, sampling=greedy)
    for prompt, tokens in zip(prompts, plain.token_ids):
        hf = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), do_sample=False,
            max_new_tokens=GREEDY_NEW_TOKENS, pad_token_id=0,
        )
        assert tokens == hf[0, len(prompt):].tolist()
    for mode in ("to", "rs"):
        for k in (1, 2, 3, 4):
            out = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=greedy, spec=SpecConfig(mode, k))
            assert out.token_ids == plain.token_ids, (mode, k)
            assert out.finish_reasons == ["length"] * len(prompts)
            # The case is only meaningful if some drafts were accepted and some rejected.
            assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens, (mode, k)


# ----------------------------------------------------------------------------- statistical


STAT_CONFIGS = {  # mode, K, sampling: both modes, K = 2 and 3, T = 1 and T = 0.7 with top-k and top-p
    "rs-k2-t1": ("rs", 2, SamplingParams(temperature=1.0, max_new_tokens=3)),
    "rs-k3-t0.7-topk-topp": ("rs", 3, SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=3)),
    "to-k3-t1": ("to", 3, SamplingParams(temperature=1.0, max_new_tokens=3)),
    "to-k2-t0.7-topk-topp": ("to", 2, SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=3)),
}


@pytest.mark.slow
@pytest.mark.parametrize("config", list(STAT_CONFIGS))
def test_speculative_sampling_matches_exact_distribution(config, monkeypatch):
    """Marginals of tokens 1, 2, 3 and the joint of (1, 2) against the enumerated plain distribution."""
    mode, k, sampling = STAT_CONFIGS[config]
    model, head = stat_model()
    blocks = record_blocks(monkeypatch)
    out = generate(model, ToyTokenizer(), [STAT_PROMPT] * NUM_ROWS, mtp=head, sampling=sampling,
                   spec=SpecConfig(mode, k), seed=1)
    tokens = np.array(out.token_ids)  # (N, 3): no EOS in this vocabulary, so every row has 3 tokens
    assert tokens.shape == (NUM_ROWS, 3)
    # Every path of the verifier must have run: rejections, partial blocks and full blocks with a bonus
    # token (blocks as emitted, before the completions' ends cut them; the prefill's are length 1 too).
    emitted = np.bincount([len(b) for _, b in blocks], minlength=k + 2)[1:]  # (K+1,) blocks of 1..K+1 tokens
    assert (emitted > 0).all(), emitted
    joint = exact_joint(model, STAT_PROMPT, sampling)
    v = STAT_VOCAB
    for t, marginal in enumerate((joint.sum((1, 2)), joint.sum((0, 2)), joint.sum((0, 1)))):
        assert_fits(np.bincount(tokens[:, t], minlength=v), marginal, f"{config} token {t + 1}")
    pairs = np.bincount(tokens[:, 0] * v + tokens[:, 1], minlength=v * v)
    assert_fits(pairs, joint.sum(2), f"{config} tokens (1, 2)")


def test_exact_joint_is_a_distribution():
    model, _ = stat_model()
    sampling = SamplingParams(temperature=0.7, top_k=5, top_p=0.9)
    joint = exact_joint(model, STAT_PROMPT, sampling)
    assert joint.shape == (STAT_VOCAB,) * 3
    assert abs(joint.sum() - 1) < 1e-9 and (joint >= 0).all()
    assert (joint.sum((1, 2)) > 0).sum() <= 5  # top-k = 5 cuts the first token's support


# ----------------------------------------------------------------------------- randomness


def _sampled(model, head, prompts, mode, seed=0, row_ids=None, k=3, eos=None, max_new_tokens=16):
    sampling = SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens)
    return generate(model, ToyTokenizer(eos), prompts, mtp=head, sampling=sampling, spec=SpecConfig(mode, k),
                    seed=seed, row_ids=row_ids)


@pytest.mark.parametrize("mode", ["none", "to", "rs"])
def test_seeded_determinism(mode):
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    prompts = toy_prompts((2, 5, 3, 7))
    first = _sampled(model, head, prompts, mode, seed=7)
    again = _sampled(model, head, prompts, mode, seed=7)
    other = _sampled(model, head, prompts, mode, seed=8)
    assert first.token_ids == again.token_ids
    assert first.token_ids != other.token_ids
    # Different rows of one call get different randomness, even with the same prompt.
    same = _sampled(model, head, [prompts[0]] * 4, mode, seed=7)
    assert len({tuple(t) for t in same.token_ids}) > 1


@pytest.mark.parametrize("mode", ["none", "to", "rs"])
def test_row_output_does_not_depend_on_its_batch(mode):
    """Row id 5 gives the same tokens alone, among 7 other prompts (which end at other steps), and
    at another position in the batch."""
    eos = 2  # other rows end early at EOS, so the batch shrinks around the tested row
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    prompt, others = toy_prompts((4,), seed=1)[0], toy_prompts((1, 6, 3, 9, 2, 5, 7), seed=2)
    alone = _sampled(model, head, [prompt], mode, row_ids=[5], eos=eos, max_new_tokens=24)
    for position in (3, 7):
        batch = others[:position] + [prompt] + others[position:]
        row_ids = [10, 11, 12, 13, 14, 15, 16][:position] + [5] + [10, 11, 12, 13, 14, 15, 16][position:]
        mixed = _sampled(model, head, batch, mode, row_ids=row_ids, eos=eos, max_new_tokens=24)
        assert mixed.token_ids[position] == alone.token_ids[0], position
        assert mixed.finish_reasons[position] == alone.finish_reasons[0]
    assert len(alone.token_ids[0]) > 4  # long enough to span several verify steps


# ----------------------------------------------------------------------------- ends of completions


def _eos_inside_a_block(blocks, completions) -> tuple[int, int, int]:
    """(row, index in the completion, token) of a token emitted before the end of its block and not
    seen earlier in its completion: made the EOS, it must cut that block short."""
    offsets = [0] * len(completions)
    for row, block in blocks:
        for i, token in enumerate(block[:-1]):
            index = offsets[row] + i
            if index < len(completions[row]) and token not in completions[row][:index]:
                return row, index, token
        offsets[row] += len(block)
    raise AssertionError("no accepted block long enough in this setup")


@pytest.mark.parametrize("mode", ["to", "rs"])
def test_eos_inside_accepted_block_ends_the_row(mode, monkeypatch):
    model = tiny_model("llama", vocab_size=VOCAB)
    head = MtpHead(model)
    prompts = toy_prompts(GREEDY_LENGTHS)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=GREEDY_NEW_TOKENS)
    blocks = record_blocks(monkeypatch)
    free = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=greedy, spec=SpecConfig(mode, 3))
    row, index, eos = _eos_inside_a_block(blocks, free.token_ids)
    blocks.clear()
    out = generate(model, ToyTokenizer(eos), prompts, mtp=head, sampling=greedy, spec=SpecConfig(mode, 3))
    plain = generate(model, ToyTokenizer(eos), prompts, sampling=greedy)
    assert out.token_ids[row] == free.token_ids[row][: index + 1]
    assert out.finish_reasons[row] == "eos" and out.lengths[row] == index + 1
    assert out.token_ids == plain.token_ids and out.finish_reasons == plain.finish_reasons
    assert any(r == row and eos in b[:-1] for r, b in blocks)  # the EOS block did emit more tokens
    assert out.texts[row] == ToyTokenizer().decode(out.token_ids[row][:-1])  # EOS not decoded
    assert out.stats.num_generated_tokens == sum(out.lengths)


@pytest.mark.parametrize("max_new_tokens", [1, 2, 7])
def test_max_new_tokens_is_exact(max_new_tokens):
    model = tiny_model("qwen3", vocab_size=VOCAB)
    head = MtpHead(model)
    out = _sampled(model, head, toy_prompts((3, 1, 6)), "rs", k=4, max_new_tokens=max_new_tokens)
    assert out.lengths == [max_new_tokens] * 3
    assert out.finish_reasons == ["length"] * 3
    assert out.stats.num_generated_tokens == 3 * max_new_tokens


@pytest.mark.parametrize("mode", ["to", "rs"])
def test_stop_string_cuts_the_completion(mode):
    model = tiny_model("llama", vocab_size=VOCAB)
    head = MtpHead(model)
    prompts = toy_prompts(GREEDY_LENGTHS)
    free = generate(model, ToyTokenizer(), prompts, sampling=SamplingParams(temperature=0.0, max_new_tokens=20))
    row = 1
    stop = ToyTokenizer().decode(free.token_ids[row][6:8])  # two words from the middle of row 1
    end = next(e for e in range(1, 21) if stop in ToyTokenizer().decode(free.token_ids[row][:e]))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=20, stop=(stop,))
    out = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=sampling, spec=SpecConfig(mode, 3))
    plain = generate(model, ToyTokenizer(), prompts, sampling=sampling)
    assert out.token_ids[row] == free.token_ids[row][:end]
    assert out.finish_reasons[row] == "stop" and out.texts[row].endswith(stop)
    assert out.token_ids == plain.token_ids and out.finish_reasons == plain.finish_reasons
    assert out.stats.num_generated_tokens == sum(out.lengths)


# ----------------------------------------------------------------------------- MTP cache


def _record_depth1_drafts(monkeypatch, prompts: list[list[int]]) -> list[tuple[int, int, torch.Tensor]]:
    """Spies on the engine's draft blocks; returns the list it fills with (row, frontier position t,
    depth-1 draft logits (V,)) for every row of every verify step."""
    records: list[tuple[int, int, torch.Tensor]] = []
    draft = Drafter.draft

    def spy(self, rows, k, sampled):
        # The target has committed prompt + completion[:-1]; the frontier pair is (h_t, last token), and a
        # row's counter is the number of tokens it has emitted.
        frontier = [len(prompts[r]) + n - 2 for r, n in zip(rows.index, rows.counters.tolist())]
        real_logits, seen = self.head.logits, []

        def record(hidden, step=0):
            logits = real_logits(hidden, step=step)
            if not seen:  # the first call of a block is depth 1
                seen.append(logits.clone())
            return logits

        self.head.logits = record
        try:
            result = draft(self, rows, k, sampled)
        finally:
            del self.head.logits
        records.extend(zip(rows.index, frontier, seen[0]))
        return result

    monkeypatch.setattr(Drafter, "draft", spy)
    return records


def _assert_drafts_match_teacher_forced_head(model, head, prompts, completions, records) -> None:
    """Every recorded depth-1 draft equals ``head.unroll`` depth 1 at its row's frontier in the final sequence."""
    references = []
    for prompt, completion in zip(prompts, completions):
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            hidden = model.get_decoder()(input_ids=ids).last_hidden_state
            references.append(head.unroll(hidden, ids, 1)[0][0])  # (T, V)
    for row, t, logits in records:
        torch.testing.assert_close(logits, references[row][t], atol=MTP_ATOL, rtol=0)


@pytest.mark.parametrize("mode", ["to", "rs"])
def test_depth1_drafts_equal_teacher_forced_head(mode, monkeypatch):
    """At every verify step the depth-1 draft logits of each row equal ``head.unroll`` depth 1 at the
    row's frontier in the final sequence: the per-row rollback of both KV caches is right."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    prompts = toy_prompts((2, 5, 9, 3))
    records = _record_depth1_drafts(monkeypatch, prompts)
    out = _sampled(model, head, prompts, mode, k=3, max_new_tokens=12)
    assert out.stats.num_drafts > 2 * len(prompts)  # several verify steps per row
    assert 0 < out.stats.num_accepted_tokens < out.stats.num_draft_tokens
    _assert_drafts_match_teacher_forced_head(model, head, prompts, out.token_ids, records)


# ----------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("mode", ["to", "rs"])
def test_stats_invariants(mode):
    k = 3
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    out = _sampled(model, head, toy_prompts((2, 5, 9, 3)), mode, k=k, max_new_tokens=12)
    s = out.stats
    assert s.speculate_k == k and s.num_drafts > 0
    assert s.num_draft_tokens == k * s.num_drafts
    assert len(s.accepted_per_pos) == k and len(s.accept_length_hist) == k + 1
    assert all(a >= b for a, b in zip(s.accepted_per_pos, s.accepted_per_pos[1:]))
    assert sum(s.accept_length_hist) == s.num_drafts
    assert s.num_accepted_tokens == sum(s.accepted_per_pos)
    assert s.num_accepted_tokens == sum(i * n for i, n in enumerate(s.accept_length_hist))
    assert 1 <= s.accept_length <= k + 1
    assert s.num_generated_tokens == sum(out.lengths)
    arrays = s.token_arrays()
    # Position j is kept when the step kept its j-th token: every step keeps position 1, and
    # position j > 1 exactly when draft j - 1 was accepted and kept.
    counts = [int((arrays["position"] == j).sum()) for j in range(1, k + 1)]
    assert counts == [s.num_drafts, *s.accepted_per_pos[: k - 1]]
    assert arrays["alpha_rs"].numel() == arrays["row"].numel() == sum(counts)
    assert torch.cat(s.token_entropy).numel() == s.num_generated_tokens
    for key in ("alpha_rs", "alpha_to"):
        assert ((arrays[key] >= 0) & (arrays[key] <= 1 + 1e-6)).all(), key
    assert ((arrays["position"] >= 1) & (arrays["position"] <= k)).all()
    metrics = s.to_metrics()
    assert metrics["spec/num_draft_tokens"] == k * metrics["spec/num_drafts"]


# ----------------------------------------------------------------------------- errors


def test_input_errors():
    model = tiny_model("qwen3", vocab_size=VOCAB, max_position_embeddings=16)
    head = MtpHead(model)
    tok = ToyTokenizer()
    for mode in ("to", "rs"):
        with pytest.raises(BebopError, match="needs an MTP head"):
            generate(model, tok, [[1, 2]], spec=SpecConfig(mode, 2))
    with pytest.raises(BebopError, match="unknown mode"):
        generate(model, tok, [[1, 2]], mtp=head, spec=SpecConfig("greedy", 2))
    for empty in ([[]], [""], [[1, 2], []]):
        with pytest.raises(BebopError, match="empty prompt"):
            generate(model, tok, empty, mtp=head, spec=SpecConfig("rs", 2))
    with pytest.raises(BebopError, match="prompt too long"):
        generate(model, tok, [[1] * 10], sampling=SamplingParams(max_new_tokens=8))
    with pytest.raises(BebopError, match="prompt too long"):  # K + 1 verify slots count too
        generate(model, tok, [[1] * 10], mtp=head, sampling=SamplingParams(max_new_tokens=4),
                 spec=SpecConfig("rs", 2))
    generate(model, tok, [[1] * 10], sampling=SamplingParams(max_new_tokens=5))  # 10 + 5 + 1 fits in 16
    with pytest.raises(BebopError, match="no prompts"):
        generate(model, tok, [], mtp=head)


# ----------------------------------------------------------------------------- switching settings (Decoder)


SCHEDULE = [("none", 1), ("rs", 3), ("none", 1), ("none", 1), ("to", 2), ("rs", 1), ("rs", 3)]  # cycled per step


def _decode_switching(model, head, prompts, sampling, seed=0, monkeypatch=None):
    """A Decoder call whose setting follows SCHEDULE step by step -> (result, K of every step)."""
    decoder = engine.Decoder(model, ToyTokenizer(), prompts, mtp=head, sampling=sampling, spec=SpecConfig("none", 1),
                             seed=seed, max_speculate_k=3)
    ks = []
    while decoder.num_active:
        mode, k = SCHEDULE[len(ks) % len(SCHEDULE)]
        decoder.set_spec(SpecConfig(mode, k))
        ks.append(k if mode != "none" else 0)
        decoder.step()
    return decoder.result(), ks


def test_switching_settings_keeps_greedy_and_the_head_cache(monkeypatch):
    """Plain steps between verify steps keep feeding the head: every depth-1 draft still equals the
    teacher-forced head at the row's frontier, and T=0 output is plain greedy."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    prompts = toy_prompts((2, 5, 9, 3))
    records = _record_depth1_drafts(monkeypatch, prompts)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16)
    out, ks = _decode_switching(model, head, prompts, greedy)
    assert out.token_ids == generate(model, ToyTokenizer(), prompts, sampling=greedy).token_ids
    assert out.stats.num_draft_tokens == sum(ks[i] * n for i, (n, _, _) in enumerate(out.step_times))
    assert 0 < out.stats.num_accepted_tokens and len(records) > 2 * len(prompts)
    _assert_drafts_match_teacher_forced_head(model, head, prompts, out.token_ids, records)


def test_switch_deeper_than_max_speculate_k_is_refused():
    model = peaked_model()
    decoder = engine.Decoder(model, ToyTokenizer(), [[1, 2]], mtp=perturbed_head(model, 0.1), spec=SpecConfig("rs", 2))
    with pytest.raises(ValueError, match="max_speculate_k=2"):
        decoder.set_spec(SpecConfig("rs", 3))


@pytest.mark.slow
def test_switching_settings_is_exact():
    """Tokens 1-3 with a setting switched at every step (plain, rs, to), chi-square against the exact
    joint: 3 marginals and 3 pairs at ALPHA = 1e-4 each (false-alarm odds at most 6e-4 for a seed
    picked at random)."""
    model, head = stat_model()
    sampling = SamplingParams(temperature=1.0, max_new_tokens=3)
    out, _ = _decode_switching(model, head, [STAT_PROMPT] * 20_000, sampling, seed=3)
    tokens = np.array(out.token_ids)
    joint, v = exact_joint(model, STAT_PROMPT, sampling), STAT_VOCAB
    for t, axes in enumerate(((1, 2), (0, 2), (0, 1))):
        assert_fits(np.bincount(tokens[:, t], minlength=v), joint.sum(axes), f"token {t + 1}")
    for (s, t), axis in (((0, 1), 2), ((1, 2), 0), ((0, 2), 1)):
        assert_fits(np.bincount(tokens[:, s] * v + tokens[:, t], minlength=v * v), joint.sum(axis),
                    f"tokens ({s + 1}, {t + 1})")
