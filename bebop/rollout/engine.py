"""Bebop's own engine as a rollout backend: exact, seeded per row, with per-token statistics."""

from __future__ import annotations

from bebop.rollout.base import Completions, RolloutBackend, repeat_prompts


class EngineBackend(RolloutBackend):
    """Samples with ``bebop.spec.generate`` on the modules it was last given (no copy: ``sync`` rebinds)."""

    name = "engine"

    def __init__(self, model, tokenizer, head=None, **_options):
        self.model, self.tokenizer, self.head = model, tokenizer, head

    def sync(self, model, head=None) -> None:
        self.model = model
        if head is not None:
            self.head = head

    def rollout(self, prompts, sampling, spec, group_size=1, seed=0, step=0, first_row=0) -> Completions:
        from bebop.spec.engine import generate

        rows = repeat_prompts(prompts, group_size)
        result = generate(self.model, self.tokenizer, rows, mtp=self.head if spec.mode != "none" else None,
                          sampling=sampling, spec=spec, seed=seed, step=step,
                          row_ids=list(range(first_row, first_row + len(rows))))
        return Completions.from_generation(result)
