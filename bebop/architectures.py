"""Which Hugging Face architectures Bebop runs, exactly.

A supported architecture is one whose every part Bebop touches is tested here: the engine's
target logits equal the model's own forward pass (sliding windows, soft-capping and the recurrent
state of hybrid models' Gated DeltaNet and Mamba2 layers included), and an MTP head built from its
attention layer, norm and rotary embedding trains and drafts. Each entry
is tested in tests/speculative/test_attention.py and tests/mtp/test_train.py on a tiny model of its class.

GPT-2, GPT-NeoX, OPT and Phi-1/2 are refused: an MTP layer is built from the backbone's
decoder-layer class, RMS norm and rotary embedding, and their blocks use LayerNorm and, for GPT-2
and OPT, learned absolute position embeddings added outside the blocks. This module imports
nothing heavy, so the CLI's --help can list the families.
"""

from __future__ import annotations

from bebop.utils.errors import BebopError

SUPPORTED_MODEL_TYPES = {  # HF config.model_type -> the family's name in messages and --help
    "llama": "Llama",
    "mistral": "Mistral",
    "mixtral": "Mixtral",
    "qwen2": "Qwen2",
    "qwen2_moe": "Qwen2-MoE",
    "qwen3": "Qwen3",
    "qwen3_moe": "Qwen3-MoE",
    "qwen3_5_text": "Qwen3.5 text",
    "qwen3_5_moe_text": "Qwen3.5-MoE text",
    "phi3": "Phi-3",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3 text",
    "olmo2": "OLMo 2",
    "smollm3": "SmolLM3",
    "qwen3_next": "Qwen3-Next",
    "nemotron_h": "Nemotron-H",
    "deepseek_v3": "DeepSeek-V3",
    "glm4_moe": "GLM-4.5",
}


def supported_families() -> str:
    """The supported families as one comma-separated phrase (for --help and errors)."""
    return ", ".join(SUPPORTED_MODEL_TYPES.values())


def check_architecture(model) -> None:
    """Raises BebopError (one line) unless ``model``'s text config is of a supported model_type."""
    check_model_type(model.config, type(model).__name__)


def check_model_type(config, name: str = "") -> None:
    """Raises BebopError (one line) unless the HF ``config``'s text config is of a supported model_type
    (checked before a model is built; ``name``: the model's class, when there is one)."""
    model_type = getattr(config.get_text_config(), "model_type", "")
    if model_type not in SUPPORTED_MODEL_TYPES:
        what = name or next(iter(getattr(config, "architectures", None) or []), "the model")
        raise BebopError(f"{what} (model_type {model_type!r}) is not supported; Bebop runs {supported_families()}")
