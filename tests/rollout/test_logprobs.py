"""Tests for bebop.rollout.logprobs: padding, token logprobs through the tiled lm_head against the full logits."""

import pytest
import torch
from torch.nn import functional as F

from bebop.rollout import logprobs as logprobs_module
from bebop.rollout.logprobs import lm_head_of, pad_sequences, token_logprobs

# ---------------------------------------------------------------- pad_sequences


def test_pad_sequences_right_pads():
    ids, attn, comp = pad_sequences([[5, 6], [7], [1, 2, 3]], [[8], [9, 4, 2], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 8, 0], [7, 9, 4, 2], [1, 2, 3, 0]]
    assert attn.tolist() == [[1, 1, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0]]
    assert comp.tolist() == [
        [False, False, True, False],
        [False, True, True, True],
        [False, False, False, False],
    ]
    assert ids.dtype == attn.dtype == torch.long and comp.dtype == torch.bool


def test_pad_sequences_rejects_bad_rows():
    with pytest.raises(ValueError, match="2 prompts but 1 completions"):
        pad_sequences([[1], [2]], [[3]], pad_id=0)
    with pytest.raises(ValueError, match="row 1 has an empty prompt"):
        pad_sequences([[1], []], [[3], [4]], pad_id=0)


# ---------------------------------------------------------------- token_logprobs


@pytest.fixture(scope="module")
def tiny_lm():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config).eval()


def _manual_logprobs(model, ids, num_prompt, temperature=1.0):
    """Naive reference for one unpadded row: log_softmax(logits[t-1] / temp)[token t]."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0] / temperature  # (T, V)
    logp = F.log_softmax(logits.float(), dim=-1)
    out = torch.zeros(len(ids))
    for t in range(num_prompt, len(ids)):
        out[t] = logp[t - 1, ids[t]]
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_manual(tiny_lm, temperature):
    prompt, completion = [3, 17, 4], [9, 22, 41, 5]
    ids, attn, comp = pad_sequences([prompt], [completion], pad_id=0)
    with torch.no_grad():
        got = token_logprobs(tiny_lm, ids, attn, comp, temperature=temperature)
    expected = _manual_logprobs(tiny_lm, prompt + completion, len(prompt), temperature)
    torch.testing.assert_close(got[0], expected, atol=1e-5, rtol=1e-5)
    assert torch.all(got[0, : len(prompt)] == 0)
    assert torch.all(got[0, len(prompt) :] < 0)


def test_padding_does_not_change_real_token_logprobs(tiny_lm):
    prompts = [[3, 17], [8, 1, 2, 6, 30], [11]]
    completions = [[9, 22], [41, 5, 7, 7], [2, 3, 4, 5, 6, 7, 8]]
    ids, attn, comp = pad_sequences(prompts, completions, pad_id=49)
    assert (attn == 0).any(), "the batch must contain padding for this test to mean anything"
    with torch.no_grad():
        batched = token_logprobs(tiny_lm, ids, attn, comp)
        for row, (prompt, completion) in enumerate(zip(prompts, completions)):
            alone = token_logprobs(tiny_lm, *pad_sequences([prompt], [completion], pad_id=49))
            n = len(prompt) + len(completion)
            torch.testing.assert_close(batched[row, :n], alone[0], atol=1e-5, rtol=1e-5)
            assert torch.all(batched[row, n:] == 0)


def test_token_logprobs_rejects_bad_inputs(tiny_lm):
    ids, attn, comp = pad_sequences([[3]], [[4]], pad_id=0)
    with pytest.raises(ValueError, match="temperature must be a finite number > 0"):
        token_logprobs(tiny_lm, ids, attn, comp, temperature=0.0)
    with pytest.raises(ValueError, match="masks must match"):
        token_logprobs(tiny_lm, ids, attn[:, :1], comp)


def _logprobs_and_grads(model, inputs, weights):
    """token_logprobs with entropies, and the gradient of sum(weights * logprobs) for every parameter."""
    logprobs, entropy = token_logprobs(model, *inputs, temperature=0.7, with_entropy=True)
    model.zero_grad(set_to_none=True)
    (logprobs * weights).sum().backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return logprobs.detach(), entropy, grads


@pytest.mark.parametrize("arch", ["qwen3", "gemma2"])
def test_tiled_lm_head_equals_full_logits(arch, monkeypatch):
    """The decoder + tiled lm_head path gives the logprobs, entropies and parameter gradients (the tied
    embedding included) of log_softmax over the model's own full logits; Gemma 2's final soft-cap at 0.5
    bends every logit, so a missing cap would show."""
    from tests.helpers.models import tiny_model

    model = tiny_model(arch, vocab_size=64)
    if arch == "gemma2":
        model.config.final_logit_softcapping = 0.5
    for p in model.parameters():
        p.requires_grad_(True)
    assert lm_head_of(model) is not None
    inputs = pad_sequences([[3, 17, 4], [8]], [[9, 22, 41], [5, 6, 7, 8, 9]], pad_id=0)
    weights = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(0))
    tiled = _logprobs_and_grads(model, inputs, weights)
    monkeypatch.setattr(logprobs_module, "lm_head_of", lambda model: None)  # the full (B, T, V) logits
    full = _logprobs_and_grads(model, inputs, weights)
    torch.testing.assert_close(tiled[0], full[0], rtol=0, atol=1e-5)
    torch.testing.assert_close(tiled[1], full[1], rtol=0, atol=1e-5)
    assert tiled[2].keys() == full[2].keys()
    for name in full[2]:
        torch.testing.assert_close(tiled[2][name], full[2][name], rtol=1e-4, atol=1e-5, msg=name)
    assert (tiled[1][inputs[2]] > 0).all() and (tiled[1][~inputs[2]] == 0).all()


def test_lm_head_with_bias_is_not_tiled(tiny_lm):
    import copy

    model = copy.deepcopy(tiny_lm)
    model.lm_head.bias = torch.nn.Parameter(torch.zeros(50))
    assert lm_head_of(model) is None and lm_head_of(tiny_lm) is not None


def test_left_padding_also_keeps_real_token_logprobs(tiny_lm):
    # pad_sequences right-pads, but position ids from the mask make left padding safe too.
    ids, attn, comp = pad_sequences([[3, 17]], [[9, 22, 5]], pad_id=0)
    left_ids = torch.cat([torch.zeros(1, 3, dtype=torch.long), ids], dim=1)
    left_attn = torch.cat([torch.zeros(1, 3, dtype=torch.long), attn], dim=1)
    left_comp = torch.cat([torch.zeros(1, 3, dtype=torch.bool), comp], dim=1)
    with torch.no_grad():
        alone = token_logprobs(tiny_lm, ids, attn, comp)
        padded = token_logprobs(tiny_lm, left_ids, left_attn, left_comp)
    torch.testing.assert_close(padded[:, 3:], alone, atol=1e-5, rtol=1e-5)




def test_docstring_examples():
    import doctest

    assert doctest.testmod(logprobs_module).failed == 0
