"""The engine's decode step reads the device at most once (a host sync on a GPU), in every mode.

Every way a step could read a tensor's values on the host is counted (``tolist``, ``item``, ``bool``,
``int``, ``float``, ``numpy``, ``cpu``); a speculative step reads its rows' tokens, counts and q's
finiteness together, a plain step its tokens. A second read would stall a GPU's queue once more per step.

The steps run in inference mode; a buffer the model makes meanwhile must not stay an inference tensor.
"""

from __future__ import annotations

import pytest
import torch

from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig
from bebop.utils.torch_utils import release_inference_buffers
from tests.helpers.engine import ToyTokenizer, peaked_model, perturbed_head, toy_prompts

HOST_READS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy", "cpu")


def _count_host_reads(monkeypatch) -> list[str]:
    reads: list[str] = []
    for name in HOST_READS:
        real = getattr(torch.Tensor, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append(_name)
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return reads


@pytest.mark.parametrize(("mode", "temperature", "verify"), [("none", 1.0, "token"), ("to", 1.0, "token"),
                                                             ("rs", 1.0, "token"), ("rs", 0.7, "block"),
                                                             ("rs", 0.0, "token")])
def test_a_decode_step_reads_the_device_once(mode, temperature, verify, monkeypatch):
    model = peaked_model(eos_token_id=None)
    head = perturbed_head(model, 0.3)
    sampling = SamplingParams(temperature=temperature, max_new_tokens=12)
    decoder = Decoder(model, ToyTokenizer(eos_token_id=5), toy_prompts((2, 5, 9, 3)), mtp=head, sampling=sampling,
                      spec=SpecConfig(mode, 3, verify=verify), seed=0)
    reads = _count_host_reads(monkeypatch)
    steps = 0
    while decoder.num_active:
        before = len(reads)
        decoder.step()
        steps += 1
        assert len(reads) - before == 1, reads[before:]
    monkeypatch.undo()
    assert steps >= 3 and decoder.result().finish_reasons


class _LazyBuffer(torch.nn.Module):
    """Registers a buffer the first time it runs, as a dynamic rotary registers its ``inv_freq``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not hasattr(self, "scale"):
            self.register_buffer("scale", torch.ones(x.shape[-1]), persistent=False)
        return x * self.scale


@pytest.mark.parametrize("released", [True, False])
def test_a_buffer_made_during_a_rollout_trains_afterwards(released, monkeypatch):
    """The decoder runs in inference mode; a buffer the model makes meanwhile is released as a normal tensor,
    so a training step that saves it for backward works (without the release, autograd refuses it)."""
    model = peaked_model(eos_token_id=None)
    lazy = _LazyBuffer()
    model.get_decoder().norm.register_forward_hook(lambda _m, _args, out: lazy(out))
    if not released:
        monkeypatch.setattr("bebop.speculative.engine.release_inference_buffers", lambda *modules: 0)
    model.add_module("lazy", lazy)
    Decoder(model, ToyTokenizer(eos_token_id=5), toy_prompts((2, 5)), sampling=SamplingParams(max_new_tokens=3),
            spec=SpecConfig("none"), seed=0).result()
    weight = torch.ones(lazy.scale.shape, requires_grad=True)
    if released:
        assert not lazy.scale.is_inference()
        (weight * lazy.scale).sum().backward()
        assert torch.equal(weight.grad, torch.ones_like(weight))
    else:
        with pytest.raises(RuntimeError, match="[Ii]nference tensor"):
            (weight * lazy.scale).sum().backward()


def test_release_inference_buffers_copies_only_inference_buffers():
    module = torch.nn.Linear(2, 2)
    module.register_buffer("normal", torch.zeros(2))
    with torch.inference_mode():
        module.register_buffer("made", torch.ones(2))
    assert module.made.is_inference()
    assert release_inference_buffers(module, None) == 1
    assert not module.made.is_inference() and torch.equal(module.made, torch.ones(2))
    assert release_inference_buffers(module) == 0
