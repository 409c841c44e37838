"""The rollout interface: ``RolloutBackend`` and the backend table.

A backend turns prompts (token ids), G, sampling settings, a mode (``none``/``to``/``rs``) and K
into ``bebop.speculative.completions.Completions``. Backends that cannot see the target's
distributions or each step's tokens (vLLM) report acceptance counts only and set ``token_stats = False``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from bebop.utils.io import BebopError

if TYPE_CHECKING:
    from bebop.speculative.completions import Completions

BACKENDS = {  # name -> "module:class", imported on first use
    "engine": "bebop.rollout.engine:EngineBackend",
    "vllm": "bebop.rollout.vllm:VllmBackend",
}
DEFAULT_BACKEND = "engine"


class RolloutBackend:
    """What samples completions. Subclasses implement ``rollout`` and, when they hold a copy of the weights, ``sync``.

    Attributes:
        name: the key in ``BACKENDS``.
        token_stats: whether ``Completions.stats`` has per-token entropy and counterfactual alpha.
        reproducible: whether a row's tokens are a function of (seed, step, row) alone.
    """

    name = "base"
    token_stats = True
    reproducible = True

    def rollout(self, prompts: list[list[int]], sampling, spec, group_size: int = 1, seed: int = 0, step: int = 0,
                first_row: int = 0) -> Completions:
        """G completions of every prompt, prompt-major.

        Args:
            prompts: token-id lists (B of them); texts are encoded with the tokenizer.
            sampling: a ``bebop.speculative.SamplingParams``.
            spec: a ``bebop.speculative.SpecConfig`` (mode none/to/rs, K).
            group_size: G, completions per prompt.
            seed, step: the randomness of the call (backends that cannot seed rows ignore them).
            first_row: the row id of the first completion (keys its randomness where rows are seeded).
        """
        raise NotImplementedError

    @classmethod
    def check_available(cls) -> None:
        """Raises BebopError (one line) when an optional package the backend needs is missing."""

    def sync(self, model, head=None) -> None:
        """From now on sample with these weights (``head`` None: the head's weights are unchanged)."""

    def close(self) -> None:
        """Frees what the backend holds (an engine, a thread)."""


def repeat_prompts(prompts: list, group_size: int) -> list:
    """Each prompt (token ids, or a text) G times in a row (prompt-major)."""
    return [p if isinstance(p, str) else list(p) for p in prompts for _ in range(group_size)]


def backend_class(name: str) -> type[RolloutBackend]:
    """The class behind ``name``; BebopError (one line) for an unknown name or a missing optional package."""
    if name not in BACKENDS:
        raise BebopError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    module, name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module), name)
    cls.check_available()
    return cls


def make_backend(name: str, model, tokenizer, head=None, **options) -> RolloutBackend:
    """The backend called ``name``, sampling with (model, head); ``options`` go to its constructor."""
    return backend_class(name)(model, tokenizer, head, **options)
