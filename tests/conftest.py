"""Shared fixtures: tiny offline models of three transformers architectures, and an isolated cache."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

ARCHITECTURES = {
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "llama": (LlamaConfig, LlamaForCausalLM),
}


def tiny_model(arch: str = "qwen3", vocab_size: int = 64, seed: int = 0, hidden_size: int = 32, num_layers: int = 2,
               eos_token_id: int | None = None, max_position_embeddings: int = 256):
    """A randomly initialised tiny causal LM built from a config (no download), frozen, eval mode."""
    config_cls, model_cls = ARCHITECTURES[arch]
    torch.manual_seed(seed)
    config = config_cls(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden_size // 4,
        max_position_embeddings=max_position_embeddings, eos_token_id=eos_token_id, pad_token_id=0,
    )
    model = model_cls(config).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test gets its own BEBOP_CACHE_DIR, so nothing reads or writes the user's cache."""
    monkeypatch.setenv("BEBOP_CACHE_DIR", str(tmp_path_factory.mktemp("bebop-cache")))


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)
