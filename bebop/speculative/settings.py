"""The settings of one generation, and the one check of their values every caller goes through.

``SamplingParams`` say how the target's distribution is processed (temperature, top-k, top-p) and
when a completion ends; ``SpecConfig`` says how it is drafted and verified (mode, K). The engine,
``bebop generate``, ``bebop rl`` and the auto chooser all validate them with ``check_settings``
(``settings_problems`` lists the problems for callers that gather several). This module imports
nothing heavy, so configs are checked before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass

from bebop.config import (
    AUTO,
    MAX_NEW_TOKENS,
    MODES,
    ROLLBACK_CHOICES,
    TOP_K,
    TOP_P,
    VERIFY_CHOICES,
    speculate_k_problem,
    temperature_problem,
)
from bebop.utils.errors import BebopError


@dataclass(frozen=True)
class SamplingParams:
    """How the target's distribution is processed and when a completion ends."""

    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    max_new_tokens: int = 64  # completion tokens per row, EOS included
    stop: tuple[str, ...] = ()  # a completion ends right after the first of these strings


@dataclass(frozen=True)
class SpecConfig:
    """Which speculative mode runs and how deep it drafts."""

    mode: str = "none"  # none | to | rs (| auto: bebop.speculative.auto picks one)
    speculate_k: int | str = 3  # K, drafts verified per target pass (| "auto", as for mode)
    draft_temperature: float | None = None  # temperature of q; None = the sampling temperature
    filter_drafts: bool = False  # apply the sampling top-k/top-p to q too (drafts and verification)
    verify: str = "token"  # token: token-wise rejection sampling | block: bebop.speculative.block (mode rs only)
    num_drafts: int = 1  # n chains per row, verified by bebop.speculative.multidraft (mode rs, verify token)
    recurrent_rollback: str = "auto"  # snapshot | replay | auto: how recurrent layers roll back (state_cache)


def distribution_problems(temperature: float, top_k: int, top_p: float, greedy_ok: bool) -> list[str]:
    """Why (temperature, top-k, top-p) cannot shape a distribution (empty when they can); see
    ``settings_problems``. ``bebop.speculative.sampling.logits_to_probs`` checks its arguments here."""
    problems = [temperature_problem(temperature, greedy_ok), TOP_K.check("top_k", top_k), TOP_P.check("top_p", top_p)]
    return [p for p in problems if p]


def _sampling_problems(sampling: SamplingParams, greedy_ok: bool) -> list[str]:
    problems = distribution_problems(sampling.temperature, sampling.top_k, sampling.top_p, greedy_ok)
    if problem := MAX_NEW_TOKENS.check("max_new_tokens", sampling.max_new_tokens):
        problems.append(problem)
    # NOTE: "" occurs in every text, so it would end every completion after its first token.
    if any(not isinstance(s, str) or not s for s in sampling.stop):
        problems.append(f"stop strings must be non-empty, got {list(sampling.stop)}")
    return problems


def verify_problem(mode: str, verify: str, backend: str = "engine") -> str | None:
    """The one-line reason a (mode, verify, backend) setting cannot run, or None.

    Example: verify_problem("to", "block") -> "verify block needs mode rs (...), got mode to".
    """
    if verify not in VERIFY_CHOICES:
        return f"verify {verify!r} is not one of {', '.join(VERIFY_CHOICES)}"
    if verify == "block" and mode != "rs":
        return f"verify block needs mode rs (it verifies against the draft's q), got mode {mode}"
    if verify == "block" and backend != "engine":
        return f"verify block needs backend engine: {backend} has no block verification"
    return None


def needs_head(mode: str, mtp_update: str = "frozen") -> bool:
    """Whether a run drafts with an MTP head (modes to and rs, and mode auto, which may choose them) or
    trains one (``mtp_update`` online): the one rule of every "needs an MTP head" check.

    Example: needs_head("none") -> False; needs_head("none", "online") -> True.
    """
    return mode != "none" or mtp_update == "online"


def head_problem(mode: str, has_head: bool, mtp_update: str = "frozen", given_by: str = "--mtp") -> str | None:
    """The one-line reason a run without a head cannot run (``needs_head``), or None; ``given_by``: how the
    caller's user gives a head (a flag, or a library argument)."""
    if has_head or not needs_head(mode, mtp_update):
        return None
    online = " with mtp_update online" if mtp_update == "online" else ""
    return f"mode {mode!r}{online} needs an MTP head ({given_by})"


def _spec_problems(spec: SpecConfig, auto_ok: bool) -> list[str]:
    modes = (*MODES, AUTO) if auto_ok else MODES
    problems = [] if spec.mode in modes else [f"unknown mode {spec.mode!r}; choose one of {', '.join(modes)}"]
    if spec.mode != "none":  # NOTE: mode none drafts nothing, so it ignores K
        problems.append(speculate_k_problem(spec.speculate_k, auto_ok))
    if spec.draft_temperature is not None:
        problem = temperature_problem(spec.draft_temperature, greedy_ok=False)
        problems.append(problem and "draft_" + problem)
    problems.append(verify_problem(spec.mode, spec.verify))
    problems.append(num_drafts_problem(spec))
    if spec.recurrent_rollback not in ROLLBACK_CHOICES:
        problems.append(f"recurrent_rollback {spec.recurrent_rollback!r} is not one of {', '.join(ROLLBACK_CHOICES)}")
    return problems


MAX_DRAFTS = 16  # chains per row: each costs a copy of the row's caches per verify step


def num_drafts_problem(spec: SpecConfig) -> str | None:
    """The one-line reason ``spec.num_drafts`` cannot run, or None.

    Example: SpecConfig("to", 3, num_drafts=2) -> "num_drafts 2 needs mode rs and verify token (...)".
    """
    n = spec.num_drafts
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_DRAFTS:
        return f"num_drafts must be an integer in [1, {MAX_DRAFTS}], got {n!r}"
    if n > 1 and (spec.mode != "rs" or spec.verify != "token"):
        return (f"num_drafts {n} needs mode rs and verify token (multi-draft verification tests drafts "
                f"against the draft's q, chain by chain), got mode {spec.mode}, verify {spec.verify}")
    return None


def settings_problems(spec: SpecConfig | None, sampling: SamplingParams | None, greedy_ok: bool = True,
                      auto_ok: bool = True) -> list[str]:
    """Every reason these settings cannot be used (empty when they can).

    Args:
        spec: mode (none/to/rs, or auto where ``auto_ok``), K (an integer >= 1, or auto where
            ``auto_ok``; not read in mode none) and the draft temperature; None: not checked.
        sampling: temperature (finite, > 0, or 0 where ``greedy_ok``), top-k (int >= 0), top-p in
            (0, 1], max_new_tokens >= 1, non-empty stop strings; None: not checked.
        greedy_ok: whether temperature 0 (greedy decoding) is allowed (not in RL: it needs samples).
        auto_ok: whether mode and K may be ``auto`` (not in ``generate``: the auto wing decides them).
    """
    problems = (_spec_problems(spec, auto_ok) if spec is not None else []) + (
        _sampling_problems(sampling, greedy_ok) if sampling is not None else [])
    return [p for p in problems if p]


def check_settings(spec: SpecConfig | None, sampling: SamplingParams | None, greedy_ok: bool = True,
                   auto_ok: bool = True) -> None:
    """Raises BebopError (one line naming every problem) unless ``settings_problems`` finds none."""
    problems = settings_problems(spec, sampling, greedy_ok, auto_ok)
    if problems:
        raise BebopError("; ".join(problems))
