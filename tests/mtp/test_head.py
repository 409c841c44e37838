"""The MTP head: shapes on three architectures, the step recurrence, save/load and clear errors."""

from __future__ import annotations

import pytest
import torch

from bebop.mtp import MtpHead
from bebop.utils.errors import BebopError
from tests.helpers.models import tiny_model


@pytest.mark.parametrize("arch", ["qwen3", "qwen2", "llama"])
def test_unroll_shapes_and_shared_modules(arch):
    model = tiny_model(arch)
    head = MtpHead(model)
    ids = torch.randint(0, 64, (2, 9))
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    logits = head.unroll(hidden, ids, 3)
    assert [tuple(x.shape) for x in logits] == [(2, 9, 64)] * 3
    # Only the MTP layers are the head's parameters; embedding and lm_head stay the backbone's.
    names = [n for n, _ in head.named_parameters()]
    assert names and all(n.startswith("layers.0.") for n in names)
    assert type(head.layers[0].mtp_block) is type(model.get_decoder().layers[-1])


def test_unroll_matches_manual_recurrence():
    """Depth j at position t reads x_{t+j} and the previous depth's output at t, causally."""
    model = tiny_model("qwen3")
    head = MtpHead(model)
    torch.nn.init.normal_(head.layers[0].eh_proj.weight, std=0.2)
    ids = torch.randint(0, 64, (1, 8))
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    logits = head.unroll(hidden, ids, 2)
    pos = torch.arange(8)[None]
    g1 = head.forward_step(hidden, torch.nn.functional.pad(ids[:, 1:], (0, 1)), pos, step=0)
    g2 = head.forward_step(g1, torch.nn.functional.pad(ids[:, 2:], (0, 2)), pos + 1, step=0)
    torch.testing.assert_close(logits[0], head.logits(g1))
    torch.testing.assert_close(logits[1], head.logits(g2))
    # Causality: changing a later token does not change earlier positions' depth-1 output.
    ids2 = ids.clone()
    ids2[0, 6] = (ids[0, 6] + 1) % 64
    hidden2 = model.get_decoder()(input_ids=ids2).last_hidden_state
    logits2 = head.unroll(hidden2, ids2, 1)
    torch.testing.assert_close(logits2[0][:, :5], logits[0][:, :5])


def test_layers_cycle_over_steps():
    model = tiny_model("qwen3")
    head = MtpHead(model, num_layers=2)
    torch.nn.init.normal_(head.layers[1].eh_proj.weight, std=0.3)
    ids = torch.randint(0, 64, (1, 6))
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    pos = torch.arange(6)[None]
    a = head.forward_step(hidden, ids, pos, step=0)
    b = head.forward_step(hidden, ids, pos, step=1)
    c = head.forward_step(hidden, ids, pos, step=2)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(a, c)


@pytest.mark.parametrize("arch", ["qwen3", "llama"])
def test_save_load_round_trip(tmp_path, arch):
    model = tiny_model(arch)
    head = MtpHead(model)
    torch.nn.init.normal_(head.layers[0].eh_proj.weight)
    head.save_pretrained(tmp_path / "head")
    assert sorted(p.name for p in (tmp_path / "head").iterdir()) == ["model.safetensors", "mtp_config.json"]
    loaded = MtpHead.from_pretrained(tmp_path / "head", model)
    for (n1, p1), (n2, p2) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert n1 == n2 and torch.equal(p1, p2)


def test_shape_mismatch_names_both_shapes(tmp_path):
    MtpHead(tiny_model("qwen3", hidden_size=32)).save_pretrained(tmp_path / "head")
    other = tiny_model("qwen3", hidden_size=64)
    with pytest.raises(BebopError, match=r"hidden_size=32.*hidden_size=64"):
        MtpHead.from_pretrained(tmp_path / "head", other)


def test_missing_and_corrupt_files(tmp_path):
    model = tiny_model("qwen3")
    with pytest.raises(BebopError, match="not found"):
        MtpHead.from_pretrained(tmp_path / "nothing", model)
    MtpHead(model).save_pretrained(tmp_path / "head")
    (tmp_path / "head" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(BebopError, match="corrupt"):
        MtpHead.from_pretrained(tmp_path / "head", model)


def test_save_is_atomic(tmp_path, monkeypatch):
    """A failing save leaves the previous head intact and no temporary directory behind."""
    model = tiny_model("qwen3")
    head = MtpHead(model)
    head.save_pretrained(tmp_path / "head")
    before = (tmp_path / "head" / "model.safetensors").read_bytes()

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("bebop.mtp.head.save_file", boom)
    with pytest.raises(OSError):
        head.save_pretrained(tmp_path / "head")
    assert (tmp_path / "head" / "model.safetensors").read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["head"]


def test_heads_build_on_every_layer_mix_the_engine_runs(tmp_path):
    """A head is an attention block built from (and started as) the backbone's last attention layer, with a
    rotary of full attention: on Gemma 3 with every layer sliding (no full-attention rotary in the backbone),
    on a 3:1 Gated DeltaNet hybrid and on NemotronH (Mamba2, MLP and attention blocks) it trains, drafts in the
    engine (greedy rs equals plain greedy) and reloads; a backbone without attention layers is refused."""
    from bebop.mtp.train import TrainMtpConfig, train_mtp
    from bebop.speculative.engine import SamplingParams, SpecConfig, generate
    from tests.helpers.engine import ToyTokenizer
    from tests.helpers.models import random_sequences

    models = {arch: tiny_model(arch, vocab_size=32) for arch in ("gemma3", "qwen3_5_hybrid", "nemotron_h")}
    assert models["gemma3"].config.layer_types == ["sliding_attention"] * 2  # Gemma3TextConfig's default
    greedy = SamplingParams(temperature=0.0, max_new_tokens=8)
    for name, model in models.items():
        cfg = TrainMtpConfig(loss="ce", steps=2, batch_size=4, speculate_k=2, save_every=0)
        head = train_mtp(model, random_sequences(num=8, vocab=32), tmp_path / name, cfg, show_progress=False)
        last_attention = 2 if name == "nemotron_h" else -1  # NemotronH's blocks: Mamba2, MLP, attention, Mamba2
        source = model.get_decoder().layers[last_attention]
        assert head.layers[0].mtp_block.state_dict().keys() == source.state_dict().keys()
        out = generate(model, ToyTokenizer(), [[1, 2, 3]], mtp=head, sampling=greedy, spec=SpecConfig("rs", 2))
        assert out.token_ids == generate(model, ToyTokenizer(), [[1, 2, 3]], sampling=greedy).token_ids
        MtpHead.from_pretrained(tmp_path / name, model)
    recurrent_only = tiny_model("qwen3_5_hybrid", layer_types=["linear_attention"] * 2)
    with pytest.raises(BebopError, match="has no attention layer"):
        MtpHead(recurrent_only)
