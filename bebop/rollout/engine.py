"""Bebop's own engine as a rollout backend: exact, seeded per row, with per-token statistics."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bebop.rollout.base import RolloutBackend, repeat_prompts

if TYPE_CHECKING:
    from bebop.speculative.completions import Completions


class EngineBackend(RolloutBackend):
    """Samples with ``bebop.speculative.generate`` on the modules it was last given (no copy: ``sync`` rebinds).

    A spec with mode or K ``auto`` runs ``bebop.speculative.auto.generate.generate_auto`` with the run's
    one ``AutoChooser`` (``chooser``: it probes on its own schedule); every call, fixed settings' too,
    feeds that chooser (``AutoChooser.observe``), so each probe's decision sees the running acceptance.
    """

    name = "engine"

    def __init__(self, model, tokenizer, head=None, **_options):
        self.model, self.tokenizer, self.head = model, tokenizer, head
        self.chooser = None  # bebop.speculative.auto.chooser.AutoChooser: the runner's, or made by the first auto call

    def sync(self, model, head=None) -> None:
        self.model = model
        if head is not None:
            self.head = head

    def rollout(self, prompts, sampling, spec, group_size=1, seed=0, step=0, first_row=0) -> Completions:
        from bebop.config import is_auto
        from bebop.speculative.auto.chooser import AutoChooser
        from bebop.speculative.auto.generate import generate_auto
        from bebop.speculative.engine import generate

        rows = repeat_prompts(prompts, group_size)
        row_ids = list(range(first_row, first_row + len(rows)))
        if is_auto(spec.mode, spec.speculate_k):
            self.chooser = self.chooser or AutoChooser()
            result, decision = generate_auto(self.model, self.tokenizer, rows, mtp=self.head, sampling=sampling,
                                             spec=spec, seed=seed, step=step, row_ids=row_ids, chooser=self.chooser)
            result.decision = decision
            return result
        result = generate(self.model, self.tokenizer, rows, mtp=self.head if spec.mode != "none" else None,
                          sampling=sampling, spec=spec, seed=seed, step=step, row_ids=row_ids)
        if self.chooser is not None:
            self.chooser.observe(result, spec.mode, sampling.temperature == 0)
        return result
