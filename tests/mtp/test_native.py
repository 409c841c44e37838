"""Native MTP layers in and out: import from each family's checkpoint layout, exact numerics against
an independent reference of each family's MTP computation, export round trips, and bad input."""

from __future__ import annotations

import functools
import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file, save_file

from bebop.mtp import MtpHead
from bebop.speculative.target import decoder_states
from bebop.mtp.native import INDEX_NAME, MTP_SHARD, export_mtp, import_mtp, weight_map
from bebop.utils.errors import BebopError
from tests.helpers.models import tiny_model
from tests.helpers.native_checkpoints import (
    FAMILIES,
    OWN_PREFIXES,
    D,
    V,
    keep_architectures,
    save_native_checkpoint,
    save_word_tokenizer,
    tiny_backbone,
)


def _rms(x, w, zero_centered, eps):
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x * (1.0 + w) if zero_centered else x * w


def _reference_logits(family: str, model, tensors, ids, num_steps):
    """The family's MTP chain written out from the checkpoint tensors (the block is the family's layer class)."""
    spec = FAMILIES[family]
    eps = getattr(model.config, "rms_norm_eps", None) or model.config.layer_norm_epsilon  # NemotronH names it so
    norm = functools.partial(_rms, zero_centered=spec["zero_centered"], eps=eps)
    block = MtpHead(model, warm_start=False).layers[0].mtp_block  # a fresh block of the family's layer class
    block.load_state_dict({k[len(spec["block"]):]: v for k, v in tensors.items()
                           if k.startswith(spec["block"]) and not k[len(spec["block"]):].startswith(OWN_PREFIXES)})
    decoder = model.get_decoder()
    b, t = ids.shape
    mask = torch.full((t, t), torch.finfo(torch.float32).min).triu(1)[None, None]
    state = decoder(input_ids=ids).last_hidden_state
    if spec.get("target_prenorm"):  # MiMo reads the backbone's state before its final norm: run the layers by hand
        x, positions = model.get_input_embeddings()(ids), torch.arange(t)[None]
        for layer in decoder.layers:
            x = layer(x, attention_mask=mask, position_embeddings=decoder.rotary_emb(x, positions), position_ids=positions)
        torch.testing.assert_close(decoder.norm(x), state)
        state = x
    out = []
    for j in range(1, num_steps + 1):
        positions = torch.arange(t)[None] + (j - 1)
        emb = model.get_input_embeddings()(torch.nn.functional.pad(ids[:, j:], (0, j)))
        if spec["zero0"]:
            emb = emb * (positions != 0)[..., None]
        e, h = norm(emb, tensors[spec["e"]]), norm(state, tensors[spec["h"]])
        x = torch.cat([h, e] if spec["hidden_first"] else [e, h], -1) @ tensors[spec["fc"]].T
        rotary = decoder.rotary_emb(x, positions) if hasattr(decoder, "rotary_emb") else None  # NemotronH: none
        x = block(x, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        normed = norm(x, tensors[spec["out"]])
        out.append(model.get_output_embeddings()(normed))
        state = x if spec["prenorm"] else normed
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_import_matches_family_reference(family, tmp_path):
    model = tiny_backbone(family)
    tensors = save_native_checkpoint(family, model, tmp_path)
    head = import_mtp(tmp_path, model)
    assert head.config.family == family
    ids = torch.randint(1, V, (2, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, state = decoder_states(model, head.config.target_prenorm, input_ids=ids)
        ours = head.unroll(state, ids, 3)
        reference = _reference_logits(family, model, tensors, ids, 3)
    for depth, (a, b) in enumerate(zip(ours, reference)):
        torch.testing.assert_close(a[:, : 10 - depth - 1], b[:, : 10 - depth - 1], atol=1e-5, rtol=1e-5)


def test_import_reads_only_shards_with_mtp_tensors(tmp_path):
    model = tiny_backbone("qwen3_5")
    save_native_checkpoint("qwen3_5", model, tmp_path)
    files = weight_map(tmp_path)
    backbone_shard = files["model.embed_tokens.weight"]
    (tmp_path / backbone_shard).write_bytes(b"not a safetensors file")  # never opened by the import
    head = import_mtp(tmp_path, model)
    assert head.config.num_layers == 1


@pytest.mark.parametrize("family", list(FAMILIES))
def test_export_then_import_is_bit_identical(family, tmp_path):
    model = tiny_backbone(family)
    save_native_checkpoint(family, model, tmp_path / "native")
    head = import_mtp(tmp_path / "native", model)
    with torch.no_grad():
        for p in head.parameters():  # a "fine-tuned" head: different from the native one
            p.add_(0.01 * torch.randn_like(p))
    head.save_pretrained(tmp_path / "head")
    out = export_mtp(tmp_path / "native", tmp_path / "head", tmp_path / "served")
    again = import_mtp(out, model)
    for name, tensor in head.state_dict().items():
        assert torch.equal(tensor, again.state_dict()[name]), name
    # The old native layer is gone from the served checkpoint: every MTP tensor lives in the new shard only.
    files = weight_map(out)
    new_names = load_file(str(out / MTP_SHARD)).keys()
    assert all(files[name] == MTP_SHARD for name in new_names)
    assert not (out / "model-native-mtp.safetensors").exists()
    # Backbone shards are copies, not hard links; small files come along; the config declares the layer.
    shard = files[next(n for n in sorted(files) if n.endswith(("embed_tokens.weight", "embeddings.weight")))]
    assert (out / shard).read_bytes() == (tmp_path / "native" / shard).read_bytes()
    assert os.stat(out / shard).st_ino != os.stat(tmp_path / "native" / shard).st_ino
    assert os.stat(out / shard).st_nlink == 1
    assert (out / "tokenizer_config.json").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config.get("mtp_num_hidden_layers", config.get("num_nextn_predict_layers")) == 1
    if family == "nemotron_h":  # the step vLLM builds: one attention block, in transformers' and vLLM's spelling
        assert config["mtp_layers_block_type"] == ["full_attention"] and config["mtp_hybrid_override_pattern"] == "*"


@pytest.mark.parametrize("step", [{}, {"mtp_layers_block_type": ["full_attention", "moe"]},
                                  {"mtp_hybrid_override_pattern": "*E"}], ids=["default", "listed", "pattern"])
def test_a_nemotron_h_mtp_step_of_several_blocks_is_refused_naming_why(step, tmp_path, capsys):
    """NVIDIA's Nemotron-H checkpoints ship an MTP step of attention then MoE (vLLM serves it); a Bebop draft
    step is one attention block: import-mtp refuses in one line, train-mtp --init auto starts from the backbone."""
    from bebop.cli import main
    from bebop.mtp.native import native_layer_count, read_config

    model = tiny_backbone("nemotron_h")
    save_native_checkpoint("nemotron_h", model, tmp_path / "native")
    save_word_tokenizer(tmp_path / "native")
    config = json.loads((tmp_path / "native" / "config.json").read_text())
    config.pop("mtp_layers_block_type")
    (tmp_path / "native" / "config.json").write_text(json.dumps({**config, **step}))
    assert native_layer_count(read_config(tmp_path / "native")) == 0
    assert main(["import-mtp", "--model", str(tmp_path / "native"), "--out", str(tmp_path / "head")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "has a nemotron_h MTP step of 2 blocks (full_attention, moe), which a head cannot import: a Bebop draft " \
           "step is one attention block" in line and not (tmp_path / "head").exists()


def test_export_takes_the_tokenizer_of_tokenizer_dir(tmp_path):
    """A model directory without tokenizer files is served with the one --tokenizer names."""
    model = tiny_backbone("qwen3_5")
    save_native_checkpoint("qwen3_5", model, tmp_path / "native")
    save_word_tokenizer(tmp_path / "tokenizer")
    MtpHead(model).save_pretrained(tmp_path / "head")
    out = export_mtp(tmp_path / "native", tmp_path / "head", tmp_path / "served", tokenizer_dir=tmp_path / "tokenizer")
    for file in (tmp_path / "tokenizer").iterdir():
        assert (out / file.name).read_bytes() == file.read_bytes(), file.name


def test_export_of_a_trained_head_onto_a_model_without_mtp_layer(tmp_path):
    """The embedded path: a Qwen3.5 backbone with no MTP layer, a head trained by Bebop from the backbone."""
    model = tiny_backbone("qwen3_5")
    model.save_pretrained(tmp_path / "model")  # one model.safetensors, no index
    keep_architectures(model, tmp_path / "model")
    head = MtpHead(model)
    head.save_pretrained(tmp_path / "head")
    out = export_mtp(tmp_path / "model", tmp_path / "head", tmp_path / "served", fmt="qwen3_5")
    assert json.loads((out / "config.json").read_text())["mtp_num_hidden_layers"] == 1
    again = import_mtp(out, model)
    assert all(torch.equal(v, again.state_dict()[k]) for k, v in head.state_dict().items())


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_export_is_readable_like_a_plain_write(tmp_path, mask):
    """Every file of the export, the MTP shard included (safetensors writes 0600), and the directory (a
    temporary directory is 0700) get what open() and mkdir() give under the umask."""
    model = tiny_backbone("qwen3_5")
    model.save_pretrained(tmp_path / "model")
    keep_architectures(model, tmp_path / "model")
    MtpHead(model).save_pretrained(tmp_path / "head")
    old = os.umask(mask)
    try:
        out = export_mtp(tmp_path / "model", tmp_path / "head", tmp_path / "served", fmt="qwen3_5")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in [out, *out.iterdir()]}
    assert MTP_SHARD in modes and modes.pop(out.name) == 0o777 & ~mask
    assert set(modes.values()) == {0o666 & ~mask}, modes


def test_a_model_without_native_layer_points_to_backbone_init(tmp_path):
    model = tiny_model("qwen3")
    model.save_pretrained(tmp_path)
    with pytest.raises(BebopError, match="no native MTP layer.*--init backbone"):
        import_mtp(tmp_path, model)


def test_bad_checkpoints_give_one_clear_error(tmp_path):
    model = tiny_backbone("qwen3_5")
    tensors = save_native_checkpoint("qwen3_5", model, tmp_path)
    index = json.loads((tmp_path / INDEX_NAME).read_text())
    # A shape that does not fit the backbone.
    save_file({**tensors, "mtp.fc.weight": torch.zeros(D, D)}, str(tmp_path / "model-native-mtp.safetensors"))
    with pytest.raises(BebopError, match=r"mtp.fc.weight .* shape \(32, 32\) .* needs \(32, 64\)"):
        import_mtp(tmp_path, model)
    # A missing tensor.
    save_file({k: v for k, v in tensors.items() if k != "mtp.norm.weight"}, str(tmp_path / "model-native-mtp.safetensors"))
    index["weight_map"].pop("mtp.norm.weight")
    (tmp_path / INDEX_NAME).write_text(json.dumps(index))
    with pytest.raises(BebopError, match="no tensor mtp.norm.weight"):
        import_mtp(tmp_path, model)
    # An index that names a missing shard.
    (tmp_path / "model-native-mtp.safetensors").unlink()
    with pytest.raises(BebopError, match="names model-native-mtp.safetensors, which does not exist"):
        import_mtp(tmp_path, model)


def test_export_refusals_write_nothing(tmp_path):
    model = tiny_backbone("qwen3_5")
    model.save_pretrained(tmp_path / "model")
    keep_architectures(model, tmp_path / "model")
    MtpHead(model).save_pretrained(tmp_path / "head")
    with pytest.raises(BebopError, match="unknown --format 'llama'"):
        export_mtp(tmp_path / "model", tmp_path / "head", tmp_path / "out", fmt="llama")
    with pytest.raises(BebopError, match="--format mimo does not fit"):
        export_mtp(tmp_path / "model", tmp_path / "head", tmp_path / "out", fmt="mimo")
    # A backbone family that no engine serves with MTP.
    qwen3 = tiny_model("qwen3")
    qwen3.save_pretrained(tmp_path / "qwen3")
    MtpHead(qwen3).save_pretrained(tmp_path / "qwen3-head")
    with pytest.raises(BebopError, match="not of an MTP-capable family"):
        export_mtp(tmp_path / "qwen3", tmp_path / "qwen3-head", tmp_path / "out")
    # A head trained for another model.
    other = tiny_backbone("mimo")
    MtpHead(other).save_pretrained(tmp_path / "mimo-head")
    with pytest.raises(BebopError, match="trained on a qwen2 model"):
        export_mtp(tmp_path / "model", tmp_path / "mimo-head", tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_import_train_native_and_export(tmp_path, capsys):
    from bebop.cli import main

    model = tiny_backbone("qwen3_5")
    save_native_checkpoint("qwen3_5", model, tmp_path / "native")
    save_word_tokenizer(tmp_path / "native")
    assert main(["import-mtp", "--model", str(tmp_path / "native"), "--out", str(tmp_path / "imported")]) == 0
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"token_ids": list(range(3, 3 + 12)), "start": 2}) + "\n" for _ in range(4)))
    train = ["train-mtp", "--model", str(tmp_path / "native"), "--data", str(data), "--steps", "1", "--batch-size", "2",
             "--lr", "0", "--speculate-k", "2"]
    assert main([*train, "--out", str(tmp_path / "native-start")]) == 0  # init auto = native: lr 0 keeps it
    assert main([*train, "--init", "backbone", "--out", str(tmp_path / "backbone-start")]) == 0
    imported = load_file(str(tmp_path / "imported" / "model.safetensors"))
    native_start = load_file(str(tmp_path / "native-start" / "model.safetensors"))
    backbone_start = load_file(str(tmp_path / "backbone-start" / "model.safetensors"))
    assert all(torch.equal(v, native_start[k]) for k, v in imported.items())
    assert not torch.equal(imported["layers.0.eh_proj.weight"], backbone_start["layers.0.eh_proj.weight"])
    args = ["export-mtp", "--model", str(tmp_path / "native"), "--mtp", str(tmp_path / "native-start")]
    assert main([*args, "--out", str(tmp_path / "served")]) == 0
    assert load_file(str(tmp_path / "served" / MTP_SHARD)).keys() == load_file(
        str(tmp_path / "native" / "model-native-mtp.safetensors")).keys()
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "served")]) == 2  # never overwrites
    assert main([*args, "--out", str(tmp_path / "other"), "--format", "bogus"]) == 2
    assert "unknown --format 'bogus'; choose one of auto, qwen3_5" in capsys.readouterr().err
    assert not (tmp_path / "other").exists()


def test_cli_import_from_a_model_without_mtp_layer(tmp_path, capsys):
    from bebop.cli import main

    model = tiny_model("qwen3", vocab_size=V)
    model.save_pretrained(tmp_path / "model")
    save_word_tokenizer(tmp_path / "model")
    capsys.readouterr()
    assert main(["import-mtp", "--model", str(tmp_path / "model"), "--out", str(tmp_path / "head")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no native MTP layer" in err and "--init backbone" in err
    assert not (tmp_path / "head").exists()


def test_an_index_naming_a_tensor_its_shard_lacks_is_one_line(tmp_path, capsys):
    """The index puts mtp.norm.weight in a shard that does not hold it."""
    from bebop.cli import main

    model = tiny_backbone("qwen3_5")
    tensors = save_native_checkpoint("qwen3_5", model, tmp_path / "native")
    save_word_tokenizer(tmp_path / "native")
    save_file({k: v for k, v in tensors.items() if k != "mtp.norm.weight"},
              str(tmp_path / "native" / "model-native-mtp.safetensors"))
    assert main(["import-mtp", "--model", str(tmp_path / "native"), "--out", str(tmp_path / "imported")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("bebop: error: checkpoint index") and "Traceback" not in line
    assert "puts tensor mtp.norm.weight in model-native-mtp.safetensors, which does not hold it" in line
    assert not (tmp_path / "imported").exists()


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_train_mtp_init_auto_on_a_declared_but_absent_mtp_layer_starts_from_the_backbone(family, tmp_path, capsys):
    """save_pretrained of a fresh DeepSeek-V3 / GLM-4.5 config declares an MTP layer and writes
    none of its tensors; --init auto starts from the backbone with a note, --init native names the remedy."""
    from bebop.cli import main

    model = tiny_backbone(family)
    model.save_pretrained(tmp_path / "model")
    save_word_tokenizer(tmp_path / "model")
    assert json.loads((tmp_path / "model" / "config.json").read_text())["num_nextn_predict_layers"] == 1
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"token_ids": list(range(3, 15)), "start": 2}) + "\n" for _ in range(4)))
    train = ["train-mtp", "--model", str(tmp_path / "model"), "--data", str(data), "--steps", "1", "--batch-size", "2",
             "--speculate-k", "2"]
    assert main([*train, "--out", str(tmp_path / "head")]) == 0
    err = capsys.readouterr().err
    assert "declares an MTP layer but its checkpoint holds none of its tensors; starting from a copy of the " \
           "backbone's last attention layer" in err
    assert (tmp_path / "head" / "model.safetensors").is_file()
    assert main([*train, "--init", "native", "--out", str(tmp_path / "native-head")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "holds none of their tensors" in line and line.endswith("--init backbone")
