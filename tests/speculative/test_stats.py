"""Tests for bebop.speculative.stats: the statistics count exactly the tokens the completions keep.

Each test recounts from the output: the engine's blocks (the tokens one prefill or verify step
emitted, before truncation) are spied on, cut to the completion lengths, and turned into verify
counts by hand; the entropies are recomputed with a plain HF forward pass over prompt + completion.
Before the fix, tokens after EOS, past ``max_new_tokens`` or after a stop string were counted, and
positions after a rejected draft were recorded, so these recounts differed.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.speculative.sampling import logits_to_probs
from bebop.speculative import stats
from bebop.speculative.stats import EmissionLog, concat_stats, entropy
from tests.helpers.engine import ToyTokenizer, peaked_model, perturbed_head, record_blocks, toy_prompts, verifier_stats

K = 3
ENTROPY_ATOL = 1e-4  # engine (batched, cached) vs one full forward: same float32 math, other batching
PROMPT_LENGTHS = (2, 5, 9, 3, 4, 6, 1, 7)


def _common_token(model, head, prompts) -> int:
    """A token the model emits often mid-completion: as EOS or stop word it cuts blocks short."""
    free = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=SamplingParams(max_new_tokens=16),
                    spec=SpecConfig("rs", K), seed=3)
    counts = torch.bincount(torch.tensor([t for c in free.token_ids for t in c[2:]]))
    return int(counts.argmax())


def _recount(blocks, prompts, lengths, mode):
    """Verify counts and kept (row, completion index, draft position) from the blocks and the lengths."""
    offsets, seen = [0] * len(prompts), [False] * len(prompts)
    hist, per_pos, kept_positions, num_cut = [0] * (K + 1), [0] * K, [], 0
    for row, block in blocks:
        kept = max(0, min(len(block), lengths[row] - offsets[row]))
        num_cut += len(block) - kept
        if mode != "none" and seen[row] and kept > 0:  # a row's first block is the prefill token
            hist[kept - 1] += 1
            for j in range(kept - 1):
                per_pos[j] += 1
            kept_positions += [(row, offsets[row] + j, j + 1) for j in range(min(kept, K))]
        offsets[row] += len(block)
        seen[row] = True
    return hist, per_pos, kept_positions, num_cut


def _hf_entropies(model, prompt, completion, temperature) -> torch.Tensor:  # (L,)
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]  # (L, V)
    return entropy(logits_to_probs(logits, temperature, 0, 1.0))


@pytest.mark.parametrize("ending", ["eos", "length", "stop"])
@pytest.mark.parametrize("mode", ["none", "to", "rs"])
def test_stats_equal_a_recount_from_the_output(mode, ending, monkeypatch):
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    prompts = toy_prompts(PROMPT_LENGTHS)
    common = _common_token(model, head, prompts)
    eos = common if ending == "eos" else None
    stop = (ToyTokenizer().WORDS[common],) if ending == "stop" else ()
    sampling = SamplingParams(temperature=0.8, max_new_tokens=7 if ending == "length" else 24, stop=stop)
    blocks = record_blocks(monkeypatch)
    out = generate(model, ToyTokenizer(eos), prompts, mtp=head, sampling=sampling, spec=SpecConfig(mode, K), seed=1)
    assert set(out.finish_reasons) >= {ending}
    s = out.stats
    hist, per_pos, kept_positions, num_cut = _recount(blocks, prompts, out.lengths, mode)
    if mode != "none":
        assert num_cut > 0  # some block was cut short: the case the old accounting got wrong
    assert s.accept_length_hist == (hist if mode != "none" else [0])
    assert s.accepted_per_pos == per_pos[: s.speculate_k]
    assert s.num_drafts == sum(hist) and s.num_accepted_tokens == sum(i * n for i, n in enumerate(hist))
    assert s.num_generated_tokens == sum(out.lengths)
    if s.num_drafts:
        emitted_by_verify = sum(out.lengths) - len(prompts)  # every kept token but the prefill token
        assert s.accept_length == pytest.approx(emitted_by_verify / s.num_drafts)
    # Entropies: one per kept token in every mode, equal to a plain forward pass's.
    reference = [_hf_entropies(model, p, c, sampling.temperature) for p, c in zip(prompts, out.token_ids)]
    got = torch.cat(s.token_entropy)
    assert got.numel() == sum(out.lengths)
    torch.testing.assert_close(got.sort().values, torch.cat(reference).sort().values, atol=ENTROPY_ATOL, rtol=0)
    # Draft positions: exactly the kept ones, per row, with the entropy of their kept token.
    arrays = s.token_arrays()
    assert arrays["position"].numel() == len(kept_positions)
    for row in range(len(prompts)):
        mine = [(i, j) for r, i, j in kept_positions if r == row]
        sel = arrays["row"] == row
        assert sorted(arrays["position"][sel].tolist()) == sorted(j for _, j in mine)
        expected = torch.tensor([float(reference[row][i]) for i, _ in mine])
        torch.testing.assert_close(arrays["entropy"][sel].sort().values, expected.sort().values,
                                   atol=ENTROPY_ATOL, rtol=0)


def test_emission_log_by_hand():
    """Row 0 ends (EOS) on the first draft of a 3-token block; row 1 keeps its whole block."""
    log = EmissionLog(speculate_k=2)
    log.add_block([0, 1], [0, 0], [1, 1], torch.tensor([[0.1], [0.2]]))  # prefill
    drafts = tuple(torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * scale for scale in (1.0, 0.1, 0.01))
    log.add_block([0, 1], [1, 1], [3, 2], torch.tensor([[0.3, 0.4, 0.5], [0.6, 0.7, 0.8]]), drafts)
    s = log.to_stats([2, 3])
    assert s.num_drafts == 2 and s.accept_length_hist == [1, 1, 0] and s.accepted_per_pos == [1, 0]
    assert s.accept_length == 1.5  # (1 + 2 kept tokens) / 2 verify steps
    assert torch.cat(s.token_entropy).tolist() == pytest.approx([0.1, 0.2, 0.3, 0.6, 0.7])
    arrays = s.token_arrays()
    assert arrays["position"].tolist() == [1, 1, 2] and arrays["row"].tolist() == [0, 1, 1]
    assert arrays["entropy"].tolist() == [1.0, 3.0, 4.0]
    assert s.num_generated_tokens == 5


def test_verifier_stats_count_every_step_before_the_stop_check():
    """vLLM's convention: every verify step counts in full; emitted-token stats cut the last ones."""
    model = peaked_model()
    head = perturbed_head(model, 0.1)
    out = generate(model, ToyTokenizer(), toy_prompts(PROMPT_LENGTHS), mtp=head, sampling=SamplingParams(max_new_tokens=7),
                   spec=SpecConfig(mode="rs", speculate_k=K), seed=3)
    raw = verifier_stats(out)
    steps = [b for b in out.log.blocks if b.drafts is not None]
    assert raw.num_drafts == sum(len(b.rows) for b in steps)
    assert raw.num_accepted_tokens == sum(w - 1 for b in steps for w in b.widths)
    assert raw.num_accepted_tokens >= out.stats.num_accepted_tokens
    assert raw.num_accepted_tokens > out.stats.num_accepted_tokens  # the last steps were cut at max_new_tokens


def _random_log(data, max_k: int):
    """An EmissionLog of random blocks (a prefill, then plain or verify steps of any K <= max_k, rows
    ending at random) and completion lengths that cut some blocks short."""
    log, rows, emitted = EmissionLog(max_k), list(range(data.draw(st.integers(1, 5)))), {}
    log.add_block(rows, [0] * len(rows), [1] * len(rows), torch.rand(len(rows), 1))
    emitted.update(dict.fromkeys(rows, 1))
    for _ in range(data.draw(st.integers(0, 6))):
        rows = [r for r in rows if data.draw(st.booleans())] or rows[:1]  # rows end; one at least goes on
        k = data.draw(st.integers(0, max_k))  # 0: a plain step
        widths = [1 if k == 0 else data.draw(st.integers(1, k + 1)) for _ in rows]
        drafts = None if k == 0 else tuple(torch.rand(len(rows), k) for _ in range(3))
        log.add_block(rows, [emitted[r] for r in rows], widths, torch.rand(len(rows), k + 1), drafts)
        for r, w in zip(rows, widths):
            emitted[r] += w
    lengths = [data.draw(st.integers(1, emitted[r])) for r in range(max(emitted) + 1)]
    return log, lengths


def _per_block_stats(log: EmissionLog, lengths: list[int]):
    """The statistics block by block, row by row, as written out by hand (the reference for ``to_stats``)."""
    hist, per_pos, entropies, positions = [0] * (log.k + 1), [0] * log.k, [], []
    drafts = tokens = 0
    for block in log.blocks:
        for i, (row, start, width) in enumerate(zip(block.rows, block.starts, block.widths)):
            kept = max(0, min(width, lengths[row] - start))
            entropies += block.token_entropy[i, :kept].tolist()
            if block.drafts is None or kept == 0:
                continue
            k = block.drafts[0].shape[1]
            drafts, tokens = drafts + 1, tokens + k
            hist[kept - 1] += 1
            for j in range(kept - 1):
                per_pos[j] += 1
            positions += [(j + 1, row, start, k, j + 1 < kept, *(float(d[i, j]) for d in block.drafts))
                          for j in range(min(kept, k))]
    return hist, per_pos, entropies, positions, drafts, tokens


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_to_stats_and_kept_match_a_count_block_by_block(data):
    max_k = data.draw(st.integers(1, 4))
    log, lengths = _random_log(data, max_k)
    hist, per_pos, entropies, positions, drafts, tokens = _per_block_stats(log, lengths)
    s = log.to_stats(lengths)
    assert (s.accept_length_hist, s.accepted_per_pos, s.num_drafts, s.num_draft_tokens) == (hist, per_pos, drafts, tokens)
    assert s.num_accepted_tokens == sum(i * n for i, n in enumerate(hist))
    assert torch.cat(s.token_entropy).tolist() == pytest.approx(entropies)
    arrays = s.token_arrays()
    assert list(zip(arrays["position"].tolist(), arrays["row"].tolist())) == [p[:2] for p in positions]
    for name, at in (("entropy", 5), ("alpha_rs", 6), ("alpha_to", 7)):
        assert arrays[name].tolist() == pytest.approx([p[at] for p in positions])
    kept = log.kept(lengths)  # auto's view of the same positions: offsets, K, accepted
    assert list(zip(kept.offset.tolist(), kept.k.tolist(), kept.accepted.tolist())) == [p[2:5] for p in positions]


def test_kept_answers_again_only_for_the_same_log_and_lengths():
    """The kept answer is reused for the same blocks and lengths only, and statistics never share its arrays."""
    log = EmissionLog(speculate_k=2)
    log.add_block([0, 1], [0, 0], [1, 1], torch.tensor([[0.1], [0.2]]))
    drafts = tuple(torch.tensor([[1.0, 2.0], [3.0, 4.0]]) * scale for scale in (1.0, 0.1, 0.01))
    log.add_block([0, 1], [1, 1], [3, 2], torch.tensor([[0.3, 0.4, 0.5], [0.6, 0.7, 0.8]]), drafts)
    first = log.to_stats([2, 3])
    first.token_entropy[0].zero_()
    first.draft_row[0] += 5
    again = log.to_stats([2, 3])
    assert torch.cat(again.token_entropy).tolist() == pytest.approx([0.1, 0.2, 0.3, 0.6, 0.7])
    assert again.token_arrays()["row"].tolist() == [0, 1, 1]
    assert log.kept([4, 3]).depth.tolist() == [1, 2, 1, 2]  # other lengths: counted anew
    log.add_block([0], [4], [1], torch.tensor([[0.9]]))
    assert log.to_stats([5, 3]).num_generated_tokens == 8 and torch.cat(log.to_stats([5, 3]).token_entropy).numel() == 8


def test_both_acceptance_conventions_by_hand():
    """Row 0 ends (EOS) on the first draft of its 3-token block, row 1 keeps its 2-token block: emitted
    tokens count 0 + 1 accepted drafts, the verifier (vLLM's counting, spec/verifier_*) 2 + 1."""
    log = EmissionLog(speculate_k=2)
    log.add_block([0, 1], [0, 0], [1, 1], torch.tensor([[0.1], [0.2]]))  # prefill
    drafts = tuple(torch.rand(2, 2) for _ in range(3))
    log.add_block([0, 1], [1, 1], [3, 2], torch.rand(2, 3), drafts)
    m = log.to_stats([2, 3]).to_metrics()
    assert (m["spec/num_drafts"], m["spec/num_accepted_tokens"], m["spec/accept_length"]) == (2, 1, 1.5)
    assert m["spec/accepted_per_pos"] == [0.5, 0.0]
    assert (m["spec/verifier_num_drafts"], m["spec/verifier_num_accepted_tokens"]) == (2, 3)
    assert m["spec/verifier_accept_length"] == 2.5 and m["spec/verifier_accepted_per_pos"] == [1.0, 0.5]
    merged = log.to_stats([2, 3]).merge(log.to_stats([2, 3]))
    assert (merged.verifier_num_drafts, merged.verifier_num_accepted_tokens, merged.verifier_accepted_per_pos) == \
        (4, 6, [4, 2])


def test_concat_stats_sums_counts_and_places_rows_after_the_parts_before():
    """Two processes' statistics of 2 rows each: counts add up, the second's rows become rows 2 and 3, and
    the parts are left as they were (the one cross-process sum of RL and TRL rollouts)."""
    log = EmissionLog(speculate_k=2)
    log.add_block([0, 1], [0, 0], [1, 1], torch.tensor([[0.1], [0.2]]))  # prefill
    log.add_block([0, 1], [1, 1], [3, 2], torch.rand(2, 3), tuple(torch.rand(2, 2) for _ in range(3)))
    first, second = log.to_stats([4, 3]), log.to_stats([4, 3])
    both = concat_stats([first, second], [2, 2])
    assert (both.num_drafts, both.num_accepted_tokens, both.accepted_per_pos) == (4, 6, [4, 2])
    assert both.num_generated_tokens == 14 and both.accept_length == first.accept_length
    assert both.token_arrays()["row"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]
    assert first.token_arrays()["row"].tolist() == second.token_arrays()["row"].tolist() == [0, 0, 1, 1]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_vllm_emitted_count_from_lengths_equals_the_engines(data):
    """vLLM's way to the engine's convention (``bebop.rollout.vllm.emitted_accepted``): each row a prefill
    token, then verify steps of 1..K+1 tokens, the stop check cutting only inside its last step; kept
    drafts from the completions' lengths and the number of verify steps equal ``to_stats``'s count, and
    ``verifier_*`` count every step in full."""
    from bebop.rollout.vllm import emitted_accepted

    k = data.draw(st.integers(1, 4))
    steps = [data.draw(st.lists(st.integers(1, k + 1), max_size=5)) for _ in range(data.draw(st.integers(1, 4)))]
    log, emitted = EmissionLog(k), [1] * len(steps)
    log.add_block(list(range(len(steps))), [0] * len(steps), [1] * len(steps), torch.rand(len(steps), 1))
    for depth in range(max(map(len, steps))):
        rows = [r for r, widths in enumerate(steps) if depth < len(widths)]
        widths = [steps[r][depth] for r in rows]
        log.add_block(rows, [emitted[r] for r in rows], widths, torch.rand(len(rows), k + 1),
                      tuple(torch.rand(len(rows), k) for _ in range(3)))
        for r, w in zip(rows, widths):
            emitted[r] += w
    lengths = [n - (data.draw(st.integers(0, w[-1] - 1)) if w else 0) for n, w in zip(emitted, steps)]
    s = log.to_stats(lengths)
    assert s.num_drafts == s.verifier_num_drafts == sum(map(len, steps))
    assert emitted_accepted(lengths, s.num_drafts) == s.num_accepted_tokens
    assert s.verifier_num_accepted_tokens == sum(w - 1 for widths in steps for w in widths)
    assert s.verifier_accepted_per_pos == [sum(w - 1 > j for widths in steps for w in widths) for j in range(k)]


@pytest.mark.parametrize("block", [1, 5, 64, stats.ENTROPY_BLOCK_ELEMENTS], ids=lambda b: f"block={b}")
def test_entropy_by_blocks_of_rows_is_the_whole_reduction(monkeypatch, block):
    """Rows a block at a time give every row's entropy bit for bit as one reduction over the tensor does, for
    (..., V) shapes of 1 to 3 dims, zeros (0 log 0 = 0), one-hot and float64 rows."""
    monkeypatch.setattr(stats, "ENTROPY_BLOCK_ELEMENTS", block)
    g = torch.Generator().manual_seed(0)
    for shape, dtype in (((7,), torch.float32), ((5, 7), torch.float32), ((3, 4, 7), torch.float64), ((0, 7), torch.float32)):
        probs = torch.softmax(3 * torch.randn(shape, generator=g, dtype=dtype), -1)
        if probs.dim() > 1 and probs.shape[0]:
            probs[0] = 0.0
            probs[0, ..., 2] = 1.0
        whole = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
        assert torch.equal(stats.entropy(probs), whole)
