"""Speculative decoding: verification (``rejection_sample``, ``block_verify``, ``greedy_verify``) and the batched engine.

Verification knows nothing about where drafts come from: it takes tensors and returns tokens and
counts. The engine (``generate``) drafts with an MTP head and verifies with the target.
"""

from bebop.speculative.settings import MODES, SamplingParams, SpecConfig

_LAZY = {  # name -> the module that holds it: these load torch, so they are imported on first use and
    # bebop.speculative.settings (every command's rollout flags) stays light for ``bebop --help``
    "Completions": "completions", "generate": "engine", "PAD_TOKEN_ID": "sampling", "logits_to_probs": "sampling",
    "SpecStats": "stats", "block_verify": "verification", "greedy_verify": "verification",
    "rejection_sample": "verification",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"bebop.speculative.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'bebop.speculative' has no attribute {name!r}")


__all__ = [
    "MODES",
    "PAD_TOKEN_ID",
    "Completions",
    "SamplingParams",
    "SpecConfig",
    "SpecStats",
    "block_verify",
    "generate",
    "greedy_verify",
    "logits_to_probs",
    "rejection_sample",
]
