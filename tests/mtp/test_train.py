"""train_mtp and evaluate_mtp on a tiny model: frozen backbone, learning, resume, exact acceptance."""

from __future__ import annotations

import json

import pytest
import torch

from bebop.mtp import MtpHead
from bebop.mtp.data import chain_tensors
from bebop.mtp.evaluate import evaluate_mtp
from bebop.mtp.train import TrainMtpConfig, train_mtp
from bebop.utils.errors import BebopError
from tests.helpers.cli import save_model_dir
from tests.helpers.models import ARCHITECTURES, SLIDING_WINDOW_KWARGS, random_sequences, tiny_model


@pytest.mark.parametrize("loss", ["ce", "fkl", "rkl", "tv", "e2e_tv"])
def test_backbone_frozen_head_trained(tmp_path, loss):
    model = tiny_model("qwen3")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    head0 = MtpHead(model)
    cfg = TrainMtpConfig(loss=loss, steps=6, batch_size=4, speculate_k=3, save_every=0, lr=1e-2)
    head = train_mtp(model, random_sequences(), tmp_path / loss, cfg, show_progress=False)
    for k, v in model.state_dict().items():
        assert torch.equal(before[k], v), f"backbone parameter {k} changed"
    changed = [not torch.equal(a, b) for a, b in zip(head0.state_dict().values(), head.state_dict().values())]
    assert all(changed), "every head parameter should move"
    rows = [json.loads(line) for line in (tmp_path / loss / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 6 and all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_every_supported_architecture_trains(tmp_path, arch):
    """Each family's head builds, trains (every parameter moves, finite loss) and reloads; Gemma 3 used to
    crash here (its rotary embedding takes the layer type)."""
    model = tiny_model(arch, sliding_window=4 if arch in SLIDING_WINDOW_KWARGS else None)
    head0 = MtpHead(model)
    cfg = TrainMtpConfig(loss="ce", steps=2, batch_size=4, speculate_k=2, save_every=0, lr=1e-2)
    head = train_mtp(model, random_sequences(), tmp_path, cfg, show_progress=False)
    before = dict(head0.named_parameters())  # parameters only: DeepSeek's routing bias is a buffer, not trained
    assert all(not torch.equal(before[name], p) for name, p in head.named_parameters())
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    MtpHead.from_pretrained(tmp_path, model)


UNSUPPORTED = {  # class names of architectures Bebop refuses, and a tiny config of each
    "GPT2LMHeadModel": ("GPT2Config", {"n_embd": 32, "n_layer": 1, "n_head": 4, "vocab_size": 64}),
    "GPTNeoXForCausalLM": ("GPTNeoXConfig", {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                                             "intermediate_size": 64, "vocab_size": 64}),
    "OPTForCausalLM": ("OPTConfig", {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
                                     "ffn_dim": 64, "vocab_size": 64}),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_unsupported_architectures_are_refused_in_one_line(tmp_path, name):
    import transformers

    from bebop import models

    config_name, kwargs = UNSUPPORTED[name]
    model = getattr(transformers, name)(getattr(transformers, config_name)(**kwargs))
    with pytest.raises(BebopError, match="is not supported; Bebop runs Llama, Mistral"):
        MtpHead(model)
    save_model_dir(tmp_path, model)
    with pytest.raises(BebopError, match=f"^{name} .* is not supported"):
        models.load_model(tmp_path, device="cpu")


def test_chain_targets_are_the_models_logits():
    """The training target p is the model's own distribution (Gemma 2's final soft-capping included)."""
    model = tiny_model("gemma2", sliding_window=4)
    model.config.final_logit_softcapping = 0.05  # far below the logits' scale: capping changes p
    ids = torch.tensor(random_sequences(num=2).token_ids[0])[None]
    _, target, mask = chain_tensors(model, MtpHead(model), ids, torch.tensor([ids.shape[1]]), torch.tensor([1]), 1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]  # (T, V)
    torch.testing.assert_close(target[:, 0][mask[:, 0]], logits[1 : mask.shape[0] + 1][mask[:, 0]])


def test_e2e_tv_training_raises_acceptance(tmp_path):
    model = tiny_model("qwen3", seed=1)
    data = random_sequences(64)
    head0 = MtpHead(model)
    torch.nn.init.normal_(head0.layers[0].eh_proj.weight, std=0.5)
    start = evaluate_mtp(model, head0, data, speculate_k=3)
    cfg = TrainMtpConfig(loss="e2e_tv", steps=40, batch_size=16, speculate_k=3, save_every=0, lr=3e-3)
    head = train_mtp(model, data, tmp_path / "h", cfg, show_progress=False)
    end = evaluate_mtp(model, head, data, speculate_k=3)
    assert end["accept_length_rs"] > start["accept_length_rs"] - 1e-3
    assert end["alpha_rs"][0] > 0.5


def test_resume_matches_uninterrupted(tmp_path):
    model = tiny_model("qwen3")
    data = random_sequences()
    full = TrainMtpConfig(loss="tv", steps=6, batch_size=4, speculate_k=2, save_every=3, ce_warmup=1)
    a = train_mtp(model, data, tmp_path / "a", full, show_progress=False)
    train_mtp(model, data, tmp_path / "b", TrainMtpConfig(loss="tv", steps=3, batch_size=4, speculate_k=2,
                                                          save_every=3, ce_warmup=1), show_progress=False)
    b = train_mtp(model, data, tmp_path / "b", full, resume=True, show_progress=False)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(va, vb, rtol=0, atol=1e-6, msg=k)
    rows_a = [json.loads(x)["loss"] for x in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    rows_b = [json.loads(x)["loss"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert rows_a == pytest.approx(rows_b, abs=1e-6)


def test_unknown_loss_is_clear():
    with pytest.raises(BebopError, match="unknown loss 'kl2'.*e2e_tv"):
        train_mtp(tiny_model(), random_sequences(), "/nonexistent/never-written", TrainMtpConfig(loss="kl2"))


def test_chain_mask_cuts_at_sequence_end():
    model = tiny_model("qwen3")
    head = MtpHead(model)
    ids = torch.randint(1, 64, (1, 6))
    draft, target, mask = chain_tensors(model, head, ids, torch.tensor([6]), torch.tensor([1]), 3)
    # starts t = 0..3 (t + 2 < 6); step j valid iff t + j + 1 < 6
    expected = torch.tensor([[True, True, True], [True, True, True], [True, True, False], [True, False, False]])
    assert torch.equal(mask, expected)
    # target step j of chain t is the backbone's logits at t + j
    full = model(input_ids=ids).logits[0]
    torch.testing.assert_close(target[1, 0], full[2])
    torch.testing.assert_close(target[0, 2], full[3])


def test_evaluate_matches_hand_computation():
    """alpha and accept length from evaluate_mtp equal a direct computation on the chain tensors."""
    model = tiny_model("qwen3")
    head = MtpHead(model)
    torch.nn.init.normal_(head.layers[0].eh_proj.weight, std=0.3)
    data = random_sequences(4)
    result = evaluate_mtp(model, head, data, speculate_k=2, batch_size=4)
    ids, lengths, starts = data.batch(list(range(4)), 0, torch.device("cpu"))
    with torch.no_grad():
        draft, target, mask = chain_tensors(model, head, ids, lengths, starts, 2)
    p, q = target.softmax(-1), draft.softmax(-1)
    alpha = torch.minimum(p, q).sum(-1)
    full = mask.all(1)
    el = alpha[full, 0] + alpha[full, 0] * alpha[full, 1]
    assert result["accept_length_rs"] == pytest.approx(1 + el.mean().item(), abs=1e-5)
    assert result["alpha_rs"][1] == pytest.approx(alpha[mask[:, 1], 1].mean().item(), abs=1e-5)
    to = p.gather(-1, q.argmax(-1, keepdim=True))[..., 0]
    assert result["alpha_to"][0] == pytest.approx(to[:, 0].mean().item(), abs=1e-5)


def _loss_names(out_dir) -> list[str]:
    return [json.loads(line)["loss_name"] for line in (out_dir / "metrics.jsonl").read_text().splitlines()]


def test_tv_losses_from_the_backbone_start_with_a_ce_warmup(tmp_path):
    """A tv/e2e_tv head with no CE training trains with CE for half its steps first (auto); a head that
    starts from a trained head, a CE run, or ce_warmup=0 does not."""
    model = tiny_model("qwen3")
    cfg = TrainMtpConfig(loss="e2e_tv", steps=6, batch_size=4, speculate_k=2, save_every=0)
    train_mtp(model, random_sequences(), tmp_path / "auto", cfg, show_progress=False)
    assert _loss_names(tmp_path / "auto") == ["ce"] * 3 + ["e2e_tv"] * 3
    train_mtp(model, random_sequences(), tmp_path / "off", TrainMtpConfig(**{**cfg.__dict__, "ce_warmup": 0}), show_progress=False)
    assert _loss_names(tmp_path / "off") == ["e2e_tv"] * 6
    from_head = TrainMtpConfig(**{**cfg.__dict__, "init_from": str(tmp_path / "auto")})
    train_mtp(model, random_sequences(), tmp_path / "fine-tuned", from_head, show_progress=False)
    assert _loss_names(tmp_path / "fine-tuned") == ["e2e_tv"] * 6
    train_mtp(model, random_sequences(), tmp_path / "ce", TrainMtpConfig(**{**cfg.__dict__, "loss": "ce"}), show_progress=False)
    assert _loss_names(tmp_path / "ce") == ["ce"] * 6
    with pytest.raises(BebopError, match="ce_warmup must be"):
        train_mtp(model, random_sequences(), tmp_path / "bad", TrainMtpConfig(**{**cfg.__dict__, "ce_warmup": 7}))
