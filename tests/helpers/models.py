"""Tiny offline models of several transformers architectures, a tiny word-level tokenizer, and random
MTP training sequences: everything a test builds instead of downloading."""

from __future__ import annotations

import torch
import transformers

from bebop.mtp.data import Sequences

ARCHITECTURES = {  # name -> (config class, model class), all built offline from a config
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
    "phi3": ("Phi3Config", "Phi3ForCausalLM"),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM"),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM"),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM"),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM"),
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM"),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM"),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM"),
    "qwen3_next": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM"),
    "glm4_moe": ("Glm4MoeConfig", "Glm4MoeForCausalLM"),
    "qwen3_5_hybrid": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM"),
    "qwen3_5_moe_hybrid": ("Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"),
    "qwen3_next_hybrid": ("Qwen3NextConfig", "Qwen3NextForCausalLM"),
    "nemotron_h": ("NemotronHConfig", "NemotronHForCausalLM"),
}
HYBRIDS = ["qwen3_5_hybrid", "qwen3_5_moe_hybrid", "qwen3_next_hybrid", "nemotron_h"]  # with recurrent layers
_ROUTED = {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "moe_intermediate_size": 16,
           "first_k_dense_replace": 1}  # DeepSeek-V3 / GLM-4.5 MoE: layer 0 dense, layer 1 routed
_GATED_DELTA = {"linear_num_value_heads": 4, "linear_num_key_heads": 2, "linear_key_head_dim": 8,
                "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4}  # Gated DeltaNet layers of a tiny width
EXTRA_KWARGS = {  # arch -> config fields a tiny model of it needs
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                  "shared_expert_intermediate_size": 16},
    "qwen3_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    "smollm3": {"bos_token_id": None},
    "qwen3_next": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                   "shared_expert_intermediate_size": 16, "layer_types": ["full_attention"] * 2},
    "deepseek_v3": {**_ROUTED, "num_key_value_heads": 4, "kv_lora_rank": 16, "q_lora_rank": 16, "qk_rope_head_dim": 4,
                    "qk_nope_head_dim": 4, "v_head_dim": 8},
    "glm4_moe": _ROUTED,
    # Hybrids: Gated DeltaNet layers (4 layers, default layer_types: three linear, then one full attention) ...
    "qwen3_5_hybrid": {**_GATED_DELTA, "num_hidden_layers": 4},
    "qwen3_5_moe_hybrid": {**_GATED_DELTA, "num_hidden_layers": 4, "num_experts": 4, "num_experts_per_tok": 2,
                           "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16},
    "qwen3_next_hybrid": {**_GATED_DELTA, "num_hidden_layers": 4, "num_experts": 4, "num_experts_per_tok": 2,
                          "moe_intermediate_size": 16, "shared_expert_intermediate_size": 16},
    # ... and Mamba2 blocks beside attention and MLP blocks, a Mamba2 block last (NemotronH).
    "nemotron_h": {"layer_types": ["linear_attention", "mlp", "full_attention", "linear_attention"],
                   "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 8, "n_groups": 2, "conv_kernel": 4,
                   "chunk_size": 8},
}
SLIDING_WINDOW_KWARGS = {  # arch -> config fields that give a 2-layer model a sliding window w
    "mistral": lambda w: {"sliding_window": w},  # every layer sliding
    "mixtral": lambda w: {"sliding_window": w},  # every layer sliding
    "phi3": lambda w: {"sliding_window": w},  # every layer sliding
    "qwen2": lambda w: {"use_sliding_window": True, "sliding_window": w, "max_window_layers": 1},  # layer 1
    "qwen3": lambda w: {"use_sliding_window": True, "sliding_window": w, "max_window_layers": 1},  # layer 1
    "gemma2": lambda w: {"sliding_window": w},  # layer 0 sliding, layer 1 full
    "gemma3": lambda w: {"sliding_window": w, "sliding_window_pattern": 2},  # layer 0 sliding, layer 1 full
}
NO_WINDOW_KWARGS = {  # arch -> config fields that turn a default sliding window off
    "mistral": {"sliding_window": None},
    "mixtral": {"sliding_window": None},
    "qwen3_5": {"layer_types": ["full_attention"] * 2},  # the text model's default mixes in linear attention
}


def tiny_model(arch: str = "qwen3", vocab_size: int = 64, seed: int = 0, hidden_size: int = 32, num_layers: int = 2,
               eos_token_id: int | None = None, max_position_embeddings: int = 256, sliding_window: int | None = None,
               layer_types: list[str] | None = None):
    """A randomly initialised tiny causal LM built from a config (no download), frozen, eval mode.

    ``sliding_window`` w gives the model's sliding layers (see SLIDING_WINDOW_KWARGS) a window of w;
    ``layer_types`` replaces the layer kinds (and count) of a model that has them. The hybrids' layer
    count is their EXTRA_KWARGS' (``num_layers`` does not apply).
    """
    config_name, model_name = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    kwargs = dict(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=max_position_embeddings, eos_token_id=eos_token_id, pad_token_id=0,
    )
    kwargs.update(EXTRA_KWARGS.get(arch, {}))
    if arch in ("phi3", "deepseek_v3"):
        del kwargs["head_dim"]  # derived: hidden_size / heads (Phi-3), qk_rope_head_dim (DeepSeek-V3 MLA)
    if sliding_window is not None:
        kwargs.update(SLIDING_WINDOW_KWARGS[arch](sliding_window))
    else:
        kwargs.update(NO_WINDOW_KWARGS.get(arch, {}))
    if layer_types is not None:
        kwargs.update(layer_types=layer_types, num_hidden_layers=len(layer_types))
    config = getattr(transformers, config_name)(**kwargs)
    model = getattr(transformers, model_name)(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


WORDS = tuple("abcdefghijkl")  # the tiny tokenizer's ordinary words, ids 4..15
SPECIAL = ("<pad>", "<s>", "</s>", "<unk>")  # ids 0..3: pad, BOS, EOS, unknown


CHAT_TEMPLATE = (  # BOS, each message's content, then "l" as the generation prompt
    "{{ bos_token }}{% for m in messages %}{{ m['content'] }} {% endfor %}{% if add_generation_prompt %}l{% endif %}"
)


def tiny_tokenizer(add_bos: bool = True):
    """A word-level fast tokenizer (16 ids) that, like Llama's, prepends BOS when ``add_bos``; built offline."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(SPECIAL + WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                           special_tokens=[("<s>", 1)])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                unk_token="<unk>", pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def random_sequences(num=32, vocab=64, seed=0) -> Sequences:
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(1, vocab, (int(torch.randint(8, 14, (1,), generator=g)),), generator=g).tolist()
            for _ in range(num)]
    return Sequences(seqs, [3] * num)
