"""Tests for bebop.speculative.attention and the engine's per-layer masks: the engine's target is the model.

What pins it, on tiny models with a sliding window of WINDOW = 8 tokens and sequences well past it:
  * the engine's target logits, over ragged prefills and speculative blocks with per-row rollbacks,
    equal the logits of the model's own full-sequence forward (Mistral/Phi-3: every layer sliding;
    Qwen2/Qwen3: one full, one sliding layer; Gemma 2/3: mixed, Gemma 2 with final logit soft-capping);
  * at temperature 0, modes ``none``, ``to`` and ``rs`` give HF ``generate(do_sample=False)``'s tokens;
  * the same checks fail when the window is ignored (the engine before the fix);
  * patterns the engine cannot reproduce (recurrent layers of families it does not run, chunked or
    bidirectional attention, scaled logits)
    are refused with one line. Hybrid (recurrent) models are pinned in test_hybrid.py.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from bebop.mtp import MtpHead
from bebop.speculative import attention
from bebop.speculative.engine import SamplingParams, SpecConfig, generate
from bebop.speculative.kv_cache import RaggedKVCache
from bebop.speculative.target import Target
from bebop.utils.errors import BebopError
from bebop.architectures import SUPPORTED_MODEL_TYPES
from tests.helpers.models import ARCHITECTURES, SLIDING_WINDOW_KWARGS, tiny_model
from tests.helpers.engine import ToyTokenizer

WINDOW = 8  # sliding window of the test models; sequences run to about 4 windows
VOCAB = 32
NEW_TOKENS = 24
LOGITS_ATOL = 1e-5  # engine vs HF forward: same float32 ops, different batching and masks
SLIDING = list(SLIDING_WINDOW_KWARGS)  # mistral, mixtral, phi3, qwen2, qwen3, gemma2, gemma3


def _ids(lengths: tuple[int, ...], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]


def _hf_logits(model, ids: list[int]) -> torch.Tensor:  # (T, V)
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def target_logits_match(model, atol: float = LOGITS_ATOL) -> bool:
    """Ragged prefill (lengths 11 and 3), then blocks of 4 tokens of which rows keep 1..4, as in
    speculative decoding, then plain steps; True iff every logit the engine's target computes equals
    HF's full forward (the prefill's at every prompt position, through the head's input state)."""
    seqs = _ids((40, 40), seed=1)
    lengths = [11, 3]
    target = Target(model, 2, 64)
    chunks = []
    with torch.no_grad():
        last, _ = target.prefill(torch.tensor([s[:11] for s in seqs]), lengths,
                                 lambda start, state: chunks.append((start, target.logits(state))))
    ok = all(torch.allclose(last[b], _hf_logits(model, seqs[b][:n])[-1], atol=atol, rtol=0)
             for b, n in enumerate(lengths))
    for start, logits in chunks:
        for b, n in enumerate(lengths[: logits.shape[0]]):
            end = min(n, start + logits.shape[1])
            ok &= torch.allclose(logits[b, : end - start], _hf_logits(model, seqs[b][:end])[start:], atol=atol, rtol=0)
    for step in range(7):
        width = 4 if step < 6 else 1  # six verify passes, then a plain step
        block = torch.tensor([s[n: n + width] for s, n in zip(seqs, lengths)])
        with torch.no_grad():
            logits, _ = target.forward(block)
        for b, n in enumerate(lengths):
            ok &= torch.allclose(logits[b], _hf_logits(model, seqs[b][: n + width])[n:], atol=atol, rtol=0)
        kept = [1 + (step + b) % width for b in range(2)]  # rows keep different numbers of the block
        target.cache.commit(kept)
        lengths = [n + k for n, k in zip(lengths, kept)]
    assert max(lengths) > 2 * WINDOW  # the case reaches well past the window
    return ok


@pytest.mark.parametrize("arch", list(ARCHITECTURES))  # every supported family, with a window where it has one
def test_target_logits_equal_model_forward(arch):
    model = tiny_model(arch, vocab_size=VOCAB, sliding_window=WINDOW if arch in SLIDING else None)
    assert target_logits_match(model)


@pytest.mark.parametrize("arch", SLIDING)
def test_greedy_equals_hf_generate_past_the_window(arch):
    model = tiny_model(arch, vocab_size=VOCAB, sliding_window=WINDOW)
    head = MtpHead(model)
    prompts = _ids((5, 12, 2))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)
    hf = [model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long), do_sample=False,
                         max_new_tokens=NEW_TOKENS, pad_token_id=0)[0, len(p):].tolist() for p in prompts]
    for mode in ("none", "to", "rs"):
        out = generate(model, ToyTokenizer(), prompts, mtp=head, sampling=greedy, spec=SpecConfig(mode, 3))
        assert out.token_ids == hf, (arch, mode)


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma2"])
def test_ignoring_the_window_fails_these_checks(arch, monkeypatch):
    """The engine before the fix (a full causal mask on every layer) fails both checks above."""
    model = tiny_model(arch, vocab_size=VOCAB, sliding_window=WINDOW)
    monkeypatch.setattr(attention, "layer_windows", lambda config: [None] * config.num_hidden_layers)
    assert not target_logits_match(model)
    prompt = _ids((5,))[0]
    hf = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, 5, dtype=torch.long),
                        do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0)[0, 5:].tolist()
    out = generate(model, ToyTokenizer(), [prompt], sampling=SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS))
    assert out.token_ids[0] != hf


def test_gemma2_logits_are_soft_capped(monkeypatch):
    model = tiny_model("gemma2", vocab_size=VOCAB, sliding_window=WINDOW)
    model.config.final_logit_softcapping = 0.05  # well below the logits' scale: capping changes p
    assert target_logits_match(model)
    monkeypatch.setattr(attention, "final_logits", lambda config, logits: logits)  # the engine before the fix
    assert not target_logits_match(model)


def test_layer_windows():
    mistral = tiny_model("mistral", sliding_window=4).config
    assert attention.layer_windows(mistral) == [4, 4]
    assert attention.layer_windows(tiny_model("qwen2", sliding_window=4).config) == [None, 4]
    assert attention.layer_windows(tiny_model("gemma3", sliding_window=4).config) == [4, None]
    assert attention.layer_windows(tiny_model("llama").config) == [None, None]
    assert attention.layer_type_windows(tiny_model("gemma2", sliding_window=4).config) == {
        "sliding_attention": 4, "full_attention": None}


def test_unsupported_patterns_are_refused_in_one_line():
    minimax = transformers.MiniMaxConfig(num_hidden_layers=2)  # lightning attention: recurrent, not run by the engine
    with pytest.raises(BebopError, match="layer 1 is 'linear_attention'"):
        attention.layer_windows(minimax)
    gemma = transformers.Gemma3TextConfig(num_hidden_layers=2, use_bidirectional_attention=True)
    with pytest.raises(BebopError, match="bidirectional"):
        attention.layer_windows(gemma)
    chunked = transformers.LlamaConfig(num_hidden_layers=1)
    chunked.layer_types = ["chunked_attention"]
    with pytest.raises(BebopError, match="'chunked_attention'"):
        attention.layer_windows(chunked)
    cohere = transformers.CohereConfig(num_hidden_layers=1, logit_scale=0.5)
    with pytest.raises(BebopError, match="logit_scale"):
        attention.check_logits(cohere)


@pytest.mark.parametrize("arch", ["mistral", "gemma3"])
def test_mtp_head_is_full_attention_in_training_and_engine(arch):
    """The head's blocks ignore the backbone's window: its teacher-forced logits past the window equal
    those of the same head under an explicit full causal mask (and Gemma 3's rotary runs)."""
    model = tiny_model(arch, vocab_size=VOCAB, sliding_window=WINDOW)
    head = MtpHead(model)
    ids = torch.tensor(_ids((4 * WINDOW,)))
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
        logits = head.unroll(hidden, ids, 1)[0]
        positions = torch.arange(ids.shape[1])[None]
        tokens = torch.nn.functional.pad(ids[:, 1:], (0, 1))
        windowed = RaggedKVCache(1, 1, ids.shape[1], ids.device, hidden.dtype)
        windowed.begin(ids.shape[1])
        bias = windowed.attention_bias(window=WINDOW)
        sliding = head.logits(head.forward_step(hidden, tokens, positions, attention_bias=bias))
    assert not torch.allclose(logits, sliding)  # the window would matter here
    full = RaggedKVCache(1, 1, ids.shape[1], ids.device, hidden.dtype)
    full.begin(ids.shape[1])
    with torch.no_grad():
        again = head.logits(head.forward_step(hidden, tokens, positions, attention_bias=full.attention_bias()))
    torch.testing.assert_close(logits, again, atol=LOGITS_ATOL, rtol=0)


def test_supported_architectures_are_the_tested_ones():
    """bebop.architectures lists exactly the families these tests (and tests/mtp/test_train.py) run."""
    tested = {tiny_model(arch, vocab_size=VOCAB).config.model_type for arch in ARCHITECTURES}
    assert tested == set(SUPPORTED_MODEL_TYPES)
