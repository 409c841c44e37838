"""token_logprobs_from_hidden: the tiled lm_head + log-softmax against plain autograd, and one case by hand."""

from __future__ import annotations

import math

import pytest
import torch

from bebop.losses.logprobs import token_logprobs_from_hidden


def _reference(hidden, weight, tokens, temperature, softcap):
    """The untiled computation: full (N, V) logits, soft-cap, float upcast, log_softmax, gather."""
    logits = hidden @ weight.T
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    log_probs = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature, dim=-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    return log_probs.gather(-1, tokens[:, None]).squeeze(-1), entropy


def _inputs(num_rows=11, width=6, vocab=37, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = (2.0 * torch.randn(num_rows, width, generator=g)).to(dtype).requires_grad_()
    weight = torch.randn(vocab, width, generator=g).to(dtype).requires_grad_()
    tokens = torch.randint(0, vocab, (num_rows,), generator=g)
    return hidden, weight, tokens


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("softcap", [None, 3.0])
@pytest.mark.parametrize("row_chunk", [None, 4])
def test_values_and_gradients_equal_plain_autograd(temperature, softcap, row_chunk):
    """float64, random inputs: log-probs, entropies and both gradients match the untiled computation,
    whole (row_chunk None) and in chunks of 4 rows (11 rows: a ragged last chunk)."""
    hidden, weight, tokens = _inputs()
    upstream = torch.randn(hidden.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    got, got_entropy = token_logprobs_from_hidden(hidden, weight, tokens, temperature, softcap=softcap,
                                                  with_entropy=True, row_chunk=row_chunk)
    (got * upstream).sum().backward()
    got_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want, want_entropy = _reference(hidden, weight, tokens, temperature, softcap)
    (want * upstream).sum().backward()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_entropy, want_entropy.detach(), rtol=0, atol=1e-12)
    torch.testing.assert_close(got_grads[0], hidden.grad, rtol=0, atol=1e-12)
    torch.testing.assert_close(got_grads[1], weight.grad, rtol=0, atol=1e-12)


def test_bfloat16_accumulates_in_float32():
    """bfloat16 inputs: float32 log-probs equal to upcasting the model's own bfloat16 logits (to float32
    rounding), and bfloat16 gradients equal to autograd's through those logits up to bfloat16 rounding
    (the weight's gradient here is summed over 3 chunks in float32, autograd's in one bfloat16 matmul)."""
    hidden, weight, tokens = _inputs(num_rows=9, width=16, vocab=300, dtype=torch.bfloat16)
    got = token_logprobs_from_hidden(hidden, weight, tokens, 0.8, row_chunk=4)
    assert got.dtype == torch.float32
    got.sum().backward()
    got_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    want, _ = _reference(hidden, weight, tokens, 0.8, None)
    want.sum().backward()
    torch.testing.assert_close(got, want.detach(), rtol=0, atol=1e-5)
    assert got_grads[0].dtype == got_grads[1].dtype == torch.bfloat16
    for got_grad, want_grad in zip(got_grads, (hidden.grad, weight.grad)):
        torch.testing.assert_close(got_grad.float(), want_grad.float(), rtol=2**-7, atol=2**-7 * want_grad.abs().max().item())


def test_hand_case():
    """hidden (1, 0); weight rows (1, 0), (0, 1), (0, 0): logits (1, 0, 0), p = (e, 1, 1) / (e + 2).

    log p(token 0) = 1 - log(e + 2) = -0.5514; d/d hidden = sum_v (onehot - p)_v weight_v
    = ((1 - p_0), -p_1) = (2, -1) / (e + 2) = (0.4239, -0.2119); H(p) = 0.9753 nats.
    """
    hidden = torch.tensor([[1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    weight = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    logprob, entropy = token_logprobs_from_hidden(hidden, weight, torch.tensor([0]), with_entropy=True)
    logprob.sum().backward()
    z = math.e + 2.0
    assert logprob.item() == pytest.approx(1.0 - math.log(z), abs=1e-12)
    assert logprob.item() == pytest.approx(-0.5514, abs=1e-4)
    assert hidden.grad[0].tolist() == pytest.approx([2.0 / z, -1.0 / z], abs=1e-12)
    assert hidden.grad[0].tolist() == pytest.approx([0.4239, -0.2119], abs=1e-4)
    probs = [math.e / z, 1.0 / z, 1.0 / z]
    assert entropy.item() == pytest.approx(-sum(p * math.log(p) for p in probs), abs=1e-12)
    assert entropy.item() == pytest.approx(0.9753, abs=1e-4)


def test_no_grad_and_empty_rows():
    hidden, weight, tokens = _inputs()
    with torch.no_grad():
        got = token_logprobs_from_hidden(hidden, weight, tokens)
    assert not got.requires_grad and got.shape == (11,)
    empty = token_logprobs_from_hidden(hidden[:0], weight, tokens[:0])
    assert empty.shape == (0,)


@pytest.mark.parametrize("change, message", [
    (lambda h, w, t: (h[:, :3], w, t), "do not fit together"),
    (lambda h, w, t: (h, w, t[:3]), "do not fit together"),
    (lambda h, w, t: (h.float(), w, t), "must share the weight's dtype"),
    (lambda h, w, t: (h, w, t.int()), "tokens must be int64"),
])
def test_bad_inputs_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        token_logprobs_from_hidden(*change(*_inputs()))
    with pytest.raises(ValueError, match="softcap"):
        token_logprobs_from_hidden(*_inputs(), softcap=0.0)
