"""The rollout interface: ``RolloutBackend`` and the backend table.

A backend turns prompts (token ids), G, sampling settings, a mode (``none``/``to``/``rs``) and K
into ``bebop.speculative.completions.Completions``. Backends that cannot see the target's
distributions or each step's tokens (vLLM) report acceptance counts only and set ``token_stats = False``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from bebop.utils.errors import BebopError

if TYPE_CHECKING:
    from bebop.speculative.completions import Completions

BACKENDS = {  # name -> "module:class", imported on first use
    "engine": "bebop.rollout.engine:EngineBackend",
    "vllm": "bebop.rollout.vllm:VllmBackend",
}
DEFAULT_BACKEND = "engine"
AUTO_BACKENDS = ("engine",)  # backends that run mode/K auto: it times their steps and reads their alphas
SHARDED_BACKENDS = ("engine",)  # backends that run in several processes, each sampling its share of the rows


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


def backend_problem(name: str, mode: str = "none", speculate_k: int | str = 1, num_processes: int = 1) -> str | None:
    """Why backend ``name`` cannot roll out (mode, K) in ``num_processes`` processes, in one line; None when it can.

    The one check of a backend choice (``bebop generate``, ``bebop rl`` and the TRL integration ask it).

    Example: backend_problem("vllm", "rs", "auto") -> "mode/speculate_k auto needs backend engine (...)".
    """
    from bebop.config import is_auto

    if name not in BACKENDS:
        return f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}"
    if num_processes > 1 and name not in SHARDED_BACKENDS:
        return (f"backend {name} does not run under torchrun or accelerate launch; use backend "
                f"{' or '.join(SHARDED_BACKENDS)}, or one process")
    if not is_auto(mode, speculate_k):
        return None
    if name not in AUTO_BACKENDS:
        return (f"mode/speculate_k auto needs backend {' or '.join(AUTO_BACKENDS)} (it times the engine's steps and "
                f"reads its acceptance); backend {name} takes a fixed mode and K")
    if num_processes > 1:
        return ("mode/speculate_k auto does not run under torchrun or accelerate launch (each process would choose "
                "from its own timings); give a fixed mode and K, or run one process")
    return None


def backend_class(name: str) -> type[RolloutBackend]:
    """The class behind ``name``; BebopError (one line) for an unknown name or a missing optional package."""
    if problem := backend_problem(name):
        raise BebopError(problem)
    module, name = BACKENDS[name].split(":")
    cls = getattr(importlib.import_module(module), name)
    cls.check_available()
    return cls


def make_backend(name: str, model, tokenizer, head=None, **options) -> RolloutBackend:
    """The backend called ``name``, sampling with (model, head); ``options`` go to its constructor."""
    return backend_class(name)(model, tokenizer, head, **options)
