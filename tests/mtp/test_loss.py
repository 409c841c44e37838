"""chain_loss: the fused draft loss on teacher-forced chains equals the plain one; its fallback."""

from __future__ import annotations

import functools

import pytest
import torch

from bebop.losses import DRAFT_LOSSES
from bebop.mtp import MtpHead
from bebop.mtp import loss as mtp_loss
from bebop.mtp import train as mtp_train
from bebop.mtp.loss import chain_loss, fused_loss_blocker
from bebop.mtp.train import TrainMtpConfig, train_mtp
from tests.helpers.models import random_sequences, tiny_model


def _loss_and_grads(model, head, name, context, fused, temperature=0.8):
    """(loss, alpha_rs, mask, head gradients) of chain_loss on a fixed batch."""
    ids, lengths, starts = random_sequences(6).batch(list(range(6)), 0, torch.device("cpu"))
    head.zero_grad(set_to_none=True)
    loss, alpha, mask = chain_loss(model, head, ids, lengths, starts, 3, context, name, temperature, fused=fused)
    loss.backward()
    return loss.detach(), alpha, mask, [p.grad.clone() for p in head.parameters()]


@pytest.mark.parametrize(
    ("arch", "context"), [("qwen3", "served"), ("qwen3", "unrolled"), ("glm4_moe", "unrolled"), ("gemma2", "served")]
)
@pytest.mark.parametrize("name", list(DRAFT_LOSSES))
def test_fused_equals_plain(name, arch, context):
    """GLM-4.5's head chains the pre-norm state (the lm_head input is post_norm of it); Gemma 2 soft-caps
    the target's logits (capped hard here so that a missing cap would show)."""
    model = tiny_model(arch, sliding_window=4 if arch == "gemma2" else None)
    if arch == "gemma2":
        model.config.final_logit_softcapping = 0.05
    head = MtpHead(model)
    assert fused_loss_blocker(model) == ""
    torch.nn.init.normal_(head.layers[0].eh_proj.weight, std=0.3)
    got, got_alpha, mask, got_grads = _loss_and_grads(model, head, name, context, fused=True)
    want, want_alpha, want_mask, want_grads = _loss_and_grads(model, head, name, context, fused=False)
    assert torch.equal(mask, want_mask) and not mask.all() and mask.any()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_alpha[mask], want_alpha[mask], atol=1e-5, rtol=1e-5)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_lm_head_with_bias_falls_back_to_the_plain_loss(monkeypatch, capsys, tmp_path):
    model = tiny_model("qwen3")
    lm_head = model.get_output_embeddings()
    biased = torch.nn.Linear(lm_head.in_features, lm_head.out_features, bias=True)
    with torch.no_grad():
        biased.weight.copy_(lm_head.weight)
        biased.bias.normal_()
    biased.requires_grad_(False)
    model.set_output_embeddings(biased)
    assert fused_loss_blocker(model) == "its lm_head adds a bias, which the fused loss does not"

    def refuse(*args, **kwargs):
        raise AssertionError("the fused loss ran on an lm_head with a bias")

    monkeypatch.setattr(mtp_loss, "draft_loss_from_hidden", refuse)
    head = MtpHead(model)
    got = _loss_and_grads(model, head, "tv", "served", fused=True)
    want = _loss_and_grads(model, head, "tv", "served", fused=False)
    assert torch.equal(got[0], want[0])
    cfg = TrainMtpConfig(loss="ce", steps=1, batch_size=2, speculate_k=2, save_every=0)
    train_mtp(model, random_sequences(), tmp_path, cfg, show_progress=False)
    assert "plain draft loss on (N, K, V) logits, not the fused one: its lm_head adds a bias" in capsys.readouterr().err


@pytest.mark.parametrize("loss", ["ce", "e2e_tv"])
def test_train_mtp_fused_gives_the_plain_head(tmp_path, monkeypatch, loss):
    model = tiny_model("qwen3")
    cfg = TrainMtpConfig(loss=loss, steps=4, batch_size=4, speculate_k=3, save_every=0, lr=1e-2, ce_warmup=0)
    fused = train_mtp(model, random_sequences(), tmp_path / "fused", cfg, show_progress=False)
    monkeypatch.setattr(mtp_train, "chain_loss", functools.partial(chain_loss, fused=False))
    plain = train_mtp(model, random_sequences(), tmp_path / "plain", cfg, show_progress=False)
    for (k, a), b in zip(fused.state_dict().items(), plain.state_dict().values()):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=k)
    assert not torch.equal(fused.state_dict()["layers.0.eh_proj.weight"], MtpHead(model).state_dict()["layers.0.eh_proj.weight"])
