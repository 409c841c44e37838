"""Tests for bebop.speculative.target: the prefill in chunks, under fixed memory budgets.

What pins it:
  * ``prefill_chunks`` by hand and on random lengths: the chunks cover every prompt position once, in
    order; a chunk's rows are those still inside their prompts; with recurrent layers every prompt
    ends at a chunk's end; no chunk's mask or token count passes its budget (unless one position does);
  * with budgets so small that every prompt runs in many chunks, the engine's logits still equal the
    model's own forward (attention with a sliding window, and hybrids whose state crosses chunks, their
    verify passes rolled back by snapshots and by replay);
  * a 16,384-token prompt decodes, no mask larger than MASK_BUDGET is built, and the logits after it
    equal the model's forward (slow: about 25 s on one CPU core).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bebop.mtp import MtpHead
from bebop.speculative import kv_cache, state_cache, target
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.speculative.target import Target, prefill_chunks
from tests.helpers.engine import ToyTokenizer
from tests.helpers.models import tiny_model
from tests.speculative.test_attention import WINDOW, target_logits_match

LONG_PROMPT = 16_384


@pytest.mark.parametrize(("lengths", "cut", "mask", "tokens", "chunks"), [
    ([5, 3, 3], True, 10**6, 10**6, [(0, 3, 3), (3, 5, 1)]),
    ([5, 3, 3], False, 10**6, 10**6, [(0, 5, 3)]),
    ([9], False, 32, 10**6, [(0, 5, 1), (5, 8, 1), (8, 9, 1)]),  # mask S x (start + S) <= 32: 5x5, 3x8, 1x9
    ([6, 6], False, 10**6, 4, [(0, 2, 2), (2, 4, 2), (4, 6, 2)]),  # 2 rows x 2 positions <= 4 tokens
    ([4, 1], True, 10**6, 10**6, [(0, 1, 2), (1, 4, 1)]),
])
def test_prefill_chunks_by_hand(lengths, cut, mask, tokens, chunks):
    assert prefill_chunks(lengths, cut, mask, tokens) == chunks


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 40), min_size=1, max_size=6), cut=st.booleans(),
       mask=st.integers(1, 400), tokens=st.integers(1, 50))
def test_prefill_chunks_cover_every_position_within_budget(lengths, cut, mask, tokens):
    lengths = sorted(lengths, reverse=True)
    chunks = prefill_chunks(lengths, cut, mask, tokens)
    assert [c[0] for c in chunks] == [0] + [c[1] for c in chunks[:-1]] and chunks[-1][1] == lengths[0]
    for start, end, rows in chunks:
        assert rows == sum(n > start for n in lengths)
        assert end - start == 1 or (rows * (end - start) * end <= mask and rows * (end - start) <= tokens)
    if cut:
        assert set(lengths) <= {end for _, end, _ in chunks}


@pytest.mark.parametrize(("arch", "rollback"), [("gemma2", "snapshot"), ("qwen3_5_hybrid", "snapshot"),
                                               ("qwen3_5_hybrid", "replay"), ("nemotron_h", "snapshot"),
                                               ("nemotron_h", "replay")])
def test_logits_equal_model_forward_in_small_chunks(arch, rollback, monkeypatch):
    monkeypatch.setattr(state_cache, "SNAPSHOT_BUDGET", 0 if rollback == "replay" else 2**62)  # auto takes it
    monkeypatch.setattr(target, "MASK_BUDGET", 40)  # a few positions per chunk
    monkeypatch.setattr(target, "PREFILL_TOKENS", 3)
    model = tiny_model(arch, vocab_size=32, sliding_window=WINDOW if arch == "gemma2" else None)
    assert target_logits_match(model)


@pytest.mark.slow
def test_a_long_prompt_decodes_within_the_mask_budget(monkeypatch):
    model = tiny_model("qwen3_5_hybrid", vocab_size=32, max_position_embeddings=LONG_PROMPT + 16)
    prompt = torch.randint(1, 32, (LONG_PROMPT,), generator=torch.Generator().manual_seed(0)).tolist()
    sizes = []
    bias = kv_cache.RaggedKVCache.attention_bias
    monkeypatch.setattr(kv_cache.RaggedKVCache, "attention_bias",
                        lambda self, *args, **kw: (lambda b: sizes.append(b.numel()) or b)(bias(self, *args, **kw)))
    out = generate(model, ToyTokenizer(), [prompt], mtp=MtpHead(model), spec=SpecConfig("rs", 3),
                   sampling=SamplingParams(temperature=0.0, max_new_tokens=8))
    assert out.lengths == [8] and max(sizes) <= target.MASK_BUDGET
    # The prompt ran in chunks whose masks fill most of the budget: at least 8 of the target's, 8 of the head's.
    assert sum(n > target.MASK_BUDGET // 2 for n in sizes) >= 16
    with torch.no_grad():
        logits, _ = Target(model, 1, LONG_PROMPT + 1).prefill(torch.tensor([prompt]), [LONG_PROMPT])
        expected = model(input_ids=torch.tensor([prompt + out.token_ids[0][:-1]])).logits[0, LONG_PROMPT - 1:]
    torch.testing.assert_close(logits[0], expected[0], atol=1e-5, rtol=0)
    assert out.token_ids[0] == expected.argmax(-1).tolist()  # greedy rs's tokens are the model's argmax
