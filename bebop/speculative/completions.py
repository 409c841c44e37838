"""``Completions``: what a rollout returns, from Bebop's engine or any other backend.

Rows are in prompt order (row b*G+g is completion g of prompt b). ``stats`` counts only the
tokens the completions keep (see ``bebop.speculative.stats``). Backends that cannot see the
target's distributions or each step's tokens (vLLM) report acceptance counts only and set
``token_stats = False``: their ``SpecStats`` hold no entropy, counterfactual alpha, accept-length
histogram or per-position acceptance on emitted tokens, and ``spec_metrics`` logs those as null.
A call with mode/K auto also carries the ``Decision`` the auto chooser made.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from bebop.speculative.stats import EmissionLog, SpecStats
from bebop.utils.errors import BebopError

ABSENT_WITHOUT_TOKEN_STATS = ("spec/alpha_rs", "spec/alpha_to", "spec/accept_length_hist", "spec/target_entropy",
                              "spec/accepted_per_pos")
UNCUT = 2**62  # a completion length past every step: nothing is cut


@dataclass
class Decision:
    """What ``bebop.speculative.auto`` chose for a call with mode/K auto: the setting, its prediction and every
    candidate's (``AutoChooser`` makes it; a ``Completions`` carries it)."""

    mode: str
    speculate_k: int  # 0 for none
    predicted_tok_s: float
    predictions: dict[str, float]  # "none", "to3", "rs1", ... -> predicted tokens/s
    rows: float = 1.0  # decoding rows the predictions are for (tokens/s scales with them)
    measured_tok_s: float = float("nan")  # tokens/s of the steps decoded at the chosen setting
    probed: bool = True  # the call probed settings and decided (else: it kept the last probe's decision)
    confirmed: bool = True  # held until the next scheduled probe (else: the next call probes, ``AutoChooser.settle``)

    def to_metrics(self) -> dict:
        return {"auto/mode": self.mode, "auto/speculate_k": self.speculate_k,
                "auto/predicted_tok_s": self.predicted_tok_s, "auto/probed": self.probed,
                "auto/confirmed": self.confirmed}


@dataclass
class Completions:
    """Completions in prompt order and the statistics of the run that sampled them."""

    prompt_ids: list[list[int]]
    token_ids: list[list[int]]  # completion tokens, EOS included when emitted
    texts: list[str]  # decoded completions, special tokens skipped
    lengths: list[int]
    finish_reasons: list[str]  # "eos" | "length" | "stop"
    stats: SpecStats = field(default_factory=SpecStats)  # kept tokens only (see bebop.speculative.stats)
    token_stats: bool = True  # False: entropy, counterfactual alpha and the accept-length histogram are absent
    decision: Decision | None = None  # what bebop.speculative.auto chose when this call had mode/K auto
    log: EmissionLog | None = field(default=None, repr=False)  # every verify step as the verifier emitted it
    # Wall time of every decode step after prefill: (active rows, seconds, seconds of its drafting;
    # 0 unless time_drafts). A step ends with the engine's host syncs, so the time is the step's on
    # any device (``bebop.speculative.auto.chooser`` reads it). Empty from other backends.
    step_times: list[tuple[int, float, float]] = field(default_factory=list, repr=False)
    prefill_seconds: float = 0.0  # wall time of the prefill (the prompts' forward and first tokens)

    def cut_after(self, token_ids: set[int], tokenizer) -> Completions:
        """These completions, each cut right after its first token in ``token_ids`` (EOS ids the engine did not
        stop at), with the statistics of the tokens kept (``EmissionLog.to_stats``); ``self`` when nothing is cut.

        Cutting a sample after a token is exact: the kept tokens are distributed as before. ``tokenizer``
        decodes the cut completions' texts. Raises BebopError when a cut is needed but the backend kept no
        ``log`` (vLLM: it stops at the EOS ids of the model's generation config).

        Example: tokens [5, 7, 2, 9] with token_ids {2} -> [5, 7, 2], finish reason "eos".
        """
        ends = [next((i + 1 for i, t in enumerate(tokens) if t in token_ids), len(tokens)) for tokens in self.token_ids]
        if ends == [len(t) for t in self.token_ids]:
            return self
        if self.log is None:
            raise BebopError(f"the rollout ran past one of the EOS ids {sorted(token_ids)}; add it to the model's "
                             "generation_config.eos_token_id")
        cut = [list(tokens[:end]) for tokens, end in zip(self.token_ids, ends)]
        changed = [end < len(tokens) for tokens, end in zip(self.token_ids, ends)]
        return dataclasses.replace(
            self, token_ids=cut, lengths=ends, stats=self.log.to_stats(ends),
            texts=[tokenizer.decode(c, skip_special_tokens=True) if ch else text
                   for c, ch, text in zip(cut, changed, self.texts)],
            finish_reasons=["eos" if ch else r for ch, r in zip(changed, self.finish_reasons)])

    def spec_metrics(self) -> dict:
        """``SpecStats.to_metrics()``, with what this backend cannot measure set to None."""
        metrics = self.stats.to_metrics()
        if not self.token_stats:
            metrics.update(dict.fromkeys(ABSENT_WITHOUT_TOKEN_STATS))
        return metrics
