"""The engine's decode step reads the device at most once (a host sync on a GPU), in every mode.

Every way a step could read a tensor's values on the host is counted (``tolist``, ``item``, ``bool``,
``int``, ``float``, ``numpy``, ``cpu``); a speculative step reads its rows' tokens, counts and q's
finiteness together, a plain step its tokens. A second read would stall a GPU's queue once more per step.
"""

from __future__ import annotations

import pytest
import torch

from bebop.speculative.engine import Decoder, SamplingParams, SpecConfig
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
