"""Tiny native-MTP checkpoints of each family (Qwen3.5, Qwen3-Next, DeepSeek-V3, GLM-4.5, MiMo, Nemotron-H) for the
import/export tests: backbones, their MTP tensors saved as the family ships them, a tokenizer."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

from bebop.mtp import MtpHead
from bebop.mtp.native import INDEX_NAME

V, D, N = 64, 32, 2  # vocabulary, width, backbone layers of every tiny checkpoint
_COMMON = dict(vocab_size=V, hidden_size=D, intermediate_size=64, num_hidden_layers=N, num_attention_heads=2,
               num_key_value_heads=1, max_position_embeddings=128, pad_token_id=0, eos_token_id=None,
               tie_word_embeddings=False)
_MOE = dict(moe_intermediate_size=16, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1,
            topk_group=1)

# Each family's model, and its MTP layer written out by hand from vLLM's model files: the checkpoint
# names of the projection's norms, the projection, the output norm and the block; the norm form;
# the projection-input order; position-0 embedding zeroing; which state the next step receives.
FAMILIES = {
    "qwen3_5": dict(
        build=lambda: Qwen3_5ForCausalLM(Qwen3_5TextConfig(**_COMMON, head_dim=16, layer_types=["full_attention"] * N,
                                                           mtp_num_hidden_layers=1)),
        e="mtp.pre_fc_norm_embedding.weight", h="mtp.pre_fc_norm_hidden.weight", fc="mtp.fc.weight",
        out="mtp.norm.weight", block="mtp.layers.0.", zero_centered=True, hidden_first=False, zero0=False,
        prenorm=False),
    "qwen3_next": dict(
        build=lambda: Qwen3NextForCausalLM(Qwen3NextConfig(
            **_COMMON, head_dim=16, layer_types=["full_attention"] * N, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=16, shared_expert_intermediate_size=16, num_nextn_predict_layers=1)),
        e="mtp.pre_fc_norm_embedding.weight", h="mtp.pre_fc_norm_hidden.weight", fc="mtp.fc.weight",
        out="mtp.norm.weight", block="mtp.layers.0.", zero_centered=True, hidden_first=False, zero0=False,
        prenorm=False),
    "deepseek_v3": dict(
        build=lambda: DeepseekV3ForCausalLM(DeepseekV3Config(
            **{**_COMMON, "num_key_value_heads": 2}, **_MOE, kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
            v_head_dim=16, num_nextn_predict_layers=1)),
        e=f"model.layers.{N}.enorm.weight", h=f"model.layers.{N}.hnorm.weight", fc=f"model.layers.{N}.eh_proj.weight",
        out=f"model.layers.{N}.shared_head.norm.weight", block=f"model.layers.{N}.", zero_centered=False,
        hidden_first=False, zero0=True, prenorm=False),
    "glm4_moe": dict(
        build=lambda: Glm4MoeForCausalLM(Glm4MoeConfig(**_COMMON, **_MOE, head_dim=16, num_nextn_predict_layers=1)),
        e=f"model.layers.{N}.enorm.weight", h=f"model.layers.{N}.hnorm.weight", fc=f"model.layers.{N}.eh_proj.weight",
        out=f"model.layers.{N}.shared_head.norm.weight", block=f"model.layers.{N}.", zero_centered=False,
        hidden_first=False, zero0=True, prenorm=True),
    "mimo": dict(
        build=lambda: Qwen2ForCausalLM(Qwen2Config(**_COMMON, head_dim=16, architectures=["MiMoForCausalLM"],
                                                   num_nextn_predict_layers=1)),
        e="model.mtp_layers.0.token_layernorm.weight", h="model.mtp_layers.0.hidden_layernorm.weight",
        fc="model.mtp_layers.0.input_proj.weight", out="model.mtp_layers.0.final_layernorm.weight",
        block="model.mtp_layers.0.", zero_centered=False, hidden_first=True, zero0=True, prenorm=False,
        target_prenorm=True),
    "nemotron_h": dict(  # a Mamba2 block, then attention; its MTP step is one attention block (pattern "*")
        build=lambda: NemotronHForCausalLM(NemotronHConfig(
            **{k: v for k, v in _COMMON.items() if k != "num_hidden_layers"}, layer_types=["linear_attention",
                                                                                       "full_attention"],
            mamba_num_heads=4, mamba_head_dim=8, ssm_state_size=8, n_groups=2, conv_kernel=4, chunk_size=8,
            num_nextn_predict_layers=1, mtp_layers_block_type=["full_attention"])),
        e="mtp.layers.0.enorm.weight", h="mtp.layers.0.hnorm.weight", fc="mtp.layers.0.eh_proj.weight",
        out="mtp.layers.0.final_layernorm.weight", block="mtp.layers.0.", zero_centered=False, hidden_first=False,
        zero0=False, prenorm=False),
}
FAMILIES_ARCH = {"qwen2": ["MiMoForCausalLM"]}  # the tiny qwen2 checkpoints here are MiMo checkpoints
OWN_PREFIXES = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.", "token_layernorm.", "hidden_layernorm.",
        "input_proj.", "final_layernorm.")  # tensors under a DeepSeek/MiMo layer prefix that are not the block's


def tiny_backbone(family: str, seed: int = 0):
    torch.manual_seed(seed)
    model = FAMILIES[family]["build"]().eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def native_tensors(family: str, model, seed: int = 1) -> dict[str, torch.Tensor]:
    """Random MTP-layer tensors under the family's checkpoint names (block shapes from the backbone's layer class)."""
    spec = FAMILIES[family]
    gen = torch.Generator().manual_seed(seed)
    block = MtpHead(model, warm_start=False).layers[0].mtp_block.state_dict()
    norm_center = 0.0 if spec["zero_centered"] else 1.0
    tensors = {spec[k]: norm_center + 0.2 * torch.randn(D, generator=gen) for k in ("e", "h", "out")}
    tensors[spec["fc"]] = 0.2 * torch.randn(D, 2 * D, generator=gen)
    for name, t in block.items():
        tensors[spec["block"] + name] = 0.2 * torch.randn(t.shape, generator=gen) + (1.0 if "norm" in name else 0.0)
    return tensors


def keep_architectures(model, directory) -> None:
    """save_pretrained writes the class name (Qwen2ForCausalLM); a MiMo checkpoint says MiMoForCausalLM."""
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = FAMILIES_ARCH.get(config["model_type"], config["architectures"])
    (directory / "config.json").write_text(json.dumps(config))
    model.config.architectures = config["architectures"]


def save_native_checkpoint(family: str, model, directory, seed: int = 1) -> dict[str, torch.Tensor]:
    """A sharded checkpoint: the backbone in several shards, the MTP layer in a shard of its own."""
    model.save_pretrained(directory, max_shard_size="40KB")
    keep_architectures(model, directory)
    (directory / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    tensors = native_tensors(family, model, seed)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(directory / "model-native-mtp.safetensors"))
    index = json.loads((directory / INDEX_NAME).read_text())
    index["weight_map"].update({k: "model-native-mtp.safetensors" for k in tensors})
    (directory / INDEX_NAME).write_text(json.dumps(index))
    return tensors


def save_word_tokenizer(directory) -> None:
    """A word-level tokenizer with the tiny models' vocabulary, so the directory loads like any HF model."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(V)}, unk_token="w1"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="w0", eos_token="w2", unk_token="w1").save_pretrained(directory)
