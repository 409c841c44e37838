"""``bebop.mtp.chain_attention``: the chains' attention without a (T, j*T) mask equals the masked one, values and
gradients, on random inputs and on each family's tiny model."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bebop.mtp import chain_attention
from bebop.mtp.chain_attention import ChainMask, attend
from bebop.mtp.chains import unroll_served
from bebop.mtp.head import MtpHead
from tests.helpers.chain_masks import served_bias, unroll_masked
from tests.helpers.models import tiny_model

ROOT = Path(__file__).resolve().parents[2]
FAMILIES = ["qwen3", "llama", "gemma2", "gemma3", "deepseek_v3", "glm4_moe", "qwen3_5_hybrid", "qwen3_next_hybrid",
            "nemotron_h", "phi3", "olmo2", "mixtral"]  # every attention the head's block can be (MLA, gated, softcap)


def test_served_bias_reference_blocks():
    visible = served_bias(2, 2, torch.float32)[0, 0] == 0
    assert visible.tolist() == [[True, False, True, False], [True, True, False, True]]


class _Module(torch.nn.Module):
    head_dim = 8


def _eager(query, keys, values, bias, scaling, softcap, groups):
    """Eager attention over concatenated keys with an additive mask (what HF's eager function computes)."""
    key, value = (torch.cat(x, 2).repeat_interleave(groups, dim=1) for x in (keys, values))
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    probs = (scores + bias).softmax(-1, dtype=torch.float32)
    return torch.matmul(probs, value).transpose(1, 2)


@pytest.mark.parametrize(("depth", "groups", "softcap", "block"), [(1, 1, None, 2**22), (3, 2, None, 40),
                                                                   (2, 1, 5.0, 24), (3, 4, None, 1)])
@pytest.mark.parametrize("path", ["attend", "blocked"])
def test_attend_equals_masked_attention_on_random_inputs(depth, groups, softcap, block, path, monkeypatch):
    """Served depth ``depth`` (base: depth 1 causal, then the chain's entries), through ``attend`` (SDPA unless
    soft-capped) and through the blocked path, in blocks of 1 row up to the whole: output and every gradient."""
    monkeypatch.setattr(chain_attention, "SCORE_BLOCK_ELEMENTS", block)
    g = torch.Generator().manual_seed(depth + groups)
    b, h, t, d = 2, 4, 11, 8
    hkv = h // groups
    query = torch.randn(b, h, t, d, generator=g, requires_grad=True)
    keys = [torch.randn(b, hkv, t, d, generator=g, requires_grad=True) for _ in range(depth)]
    values = [torch.randn(b, hkv, t, 6, generator=g, requires_grad=True) for _ in range(depth)]
    if path == "attend":
        mask = ChainMask(served=True, depths=list(zip(keys[:-1], values[:-1])))
        out, _ = attend(_Module().eval(), query, keys[-1], values[-1], mask, scaling=0.3, softcap=softcap)
    else:
        wide = [x.repeat_interleave(groups, dim=1) for x in (*keys, *values)]
        out = chain_attention._blocked_attend(query, wide[0], wide[depth], wide[1:depth] + wide[depth + 1:],
                                              depth - 1, 0.3, softcap, 0.0).transpose(1, 2)
    ref = _eager(query, keys, values, served_bias(t, depth, torch.float32), 0.3, softcap, groups)
    weights = torch.randn(ref.shape, generator=g)
    grads = torch.autograd.grad((out * weights).sum(), [query, *keys, *values])
    ref_grads = torch.autograd.grad((ref * weights).sum(), [query, *keys, *values])
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_attend_refuses_a_tensor_mask():
    x = torch.zeros(1, 1, 2, 8)
    with pytest.raises(TypeError, match="teacher-forced chains only"):
        attend(_Module(), x, x, x, torch.zeros(1, 1, 2, 2))


@pytest.mark.parametrize("arch", FAMILIES)
@pytest.mark.parametrize("context", ["served", "unrolled"])
def test_chains_equal_the_masked_chains_on_each_family(arch, context, monkeypatch):
    """Draft logits of every depth and the head's gradients equal the masked reference (fp32), with query
    blocks of a few rows; the backbone's attention implementation is left as it was."""
    monkeypatch.setattr(chain_attention, "SCORE_BLOCK_ELEMENTS", 4 * 4 * 5)  # 5 rows per block at B = 4 heads = 4
    model = tiny_model(arch)
    head = MtpHead(model)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    ids = torch.randint(1, 64, (2, 13), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    run = {"served": lambda: unroll_served(head, hidden, ids, 3), "unrolled": lambda: head.unroll(hidden, ids, 3)}
    implementation = head.layers[0].config._attn_implementation
    results = []
    for unroll in (run[context], lambda: unroll_masked(head, hidden, ids, 3, context)):
        logits = unroll()
        loss = sum((x * torch.linspace(-1, 1, x.shape[-1])).sum() * (j + 1) for j, x in enumerate(logits))
        grads = torch.autograd.grad(loss, list(head.parameters()), allow_unused=True)
        results.append((logits, grads))
    assert head.layers[0].config._attn_implementation == implementation
    (logits, grads), (ref_logits, ref_grads) = results
    for got, want in zip(logits, ref_logits):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert any(g is not None and bool(g.abs().sum() > 0) for g in grads)
    for got, want in zip(grads, ref_grads):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["train-mtp", "eval-mtp", "online"])
def test_a_16k_token_sequence_at_k3_fits_in_linear_memory(kind):
    """train-mtp's loss and backward, eval-mtp and the online head step on one 16,384-token sequence (K = 3), each in
    a fresh process: the peak beyond its start stays under 1 GB, where the (T, j*T) masks alone took 6.4 GB."""
    proc = subprocess.run([sys.executable, "-m", "tests.helpers.long_chains", kind], cwd=ROOT, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.splitlines()[-1])
    assert math.isfinite(result["value"]) and result["value"] > 0
    assert result["extra_mb"] < 1024, result
