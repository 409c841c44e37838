"""The rollout's settings, each declared once, and the one check of their values every caller goes through.

Each setting of a generation is a ``Setting`` here (default, help, choices, check): ``SamplingParams``
say how the target's distribution is processed (temperature, top-k, top-p) and when a completion ends;
``SpecConfig`` says how it is drafted and verified (mode, K, verify). Their fields are these
declarations, and ``bebop generate``, ``bebop rl`` and the TRL integration embed the two classes
(``bebop.config.group``), so a setting declared here is a flag, a config-file key and a field at once.
The engine and the auto chooser validate them with ``check_settings`` (``settings_problems`` lists
the problems for callers that gather several). This module imports nothing heavy, so configs are
checked before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bebop.config import (
    AUTO,
    AUTO_MAX_K,
    Setting,
    field_problems,
    integer_in,
    number_in,
    parse_speculate_k,
    positive_temperature,
    speculate_k_problem,
    temperature_problem,
)
from bebop.utils.errors import BebopError

MODES = ("none", "to", "rs")  # plain | target-only | rejection sampling (bebop.speculative)
VERIFY_CHOICES = ("token", "block")  # token-wise rejection sampling | block verification (bebop.speculative.block)
MAX_DRAFTS = 16  # chains per row: each costs a copy of the row's caches per verify step
ROLLBACK_CHOICES = ("auto", "snapshot", "replay")  # how recurrent layers roll back a verify pass (state_cache)


def _stop_strings(name: str, value: Any) -> str | None:
    # NOTE: "" occurs in every text, so it would end every completion after its first token.
    if any(not isinstance(s, str) or not s for s in value):
        return f"{name} strings must be non-empty, got {list(value)}"
    return None


# ---------------------------------------------------------------------------------------------- declarations
MODE = Setting("none", "decoding: none (plain) | to (target-only) | rs (rejection sampling) | auto (the fastest "
               "predicted after short probes)", choices=(*MODES, AUTO))
SPECULATE_K = Setting(3, f"K, drafts verified per target forward, or auto (1-{AUTO_MAX_K}, the fastest predicted)",
                      check=lambda name, value: speculate_k_problem(value, auto_ok=True, name=name),
                      parse=parse_speculate_k)
DRAFT_TEMPERATURE = Setting(None, "temperature of the draft distribution q (default: the sampling temperature)",
                            check=positive_temperature, parse=float)
FILTER_DRAFTS = Setting(False, "apply --top-k/--top-p to the draft distribution q too (drafts and verification; "
                        "exact)")
VERIFY = Setting("token", "how mode rs verifies a drafted chain: token (token-wise) | block (jointly, Sun et al. "
                 "2024: exact, never fewer accepted drafts in expectation; engine backend only)", choices=VERIFY_CHOICES)
NUM_DRAFTS = Setting(1, "n draft chains per row, verified together by bebop.speculative.multidraft (mode rs, "
                     "verify token, engine backend; more accepted drafts, but on a CPU each chain costs its own "
                     "rows: docs/multidraft.md)", check=integer_in(1, MAX_DRAFTS))
RECURRENT_ROLLBACK = Setting("auto", "how a hybrid's recurrent layers roll back a verify pass: snapshot (keep the "
                             "state after every position) | replay (keep their inputs, rerun the kept ones: less "
                             "memory) | auto (replay when the snapshots would be large); exact either way",
                             choices=ROLLBACK_CHOICES)
TEMPERATURE = Setting(1.0, "sampling temperature; 0 = greedy decoding (not in rl, whose loss divides by it)",
                      check=lambda name, value: temperature_problem(value, greedy_ok=True, name=name))
TOP_K = Setting(0, "top-k filter of the target's distribution; 0 = off", check=integer_in(0))
TOP_P = Setting(1.0, "top-p (nucleus) filter of the target's distribution; 1 = off",
                check=number_in(0, 1, low_open=True))
MAX_NEW_TOKENS = Setting(64, "completion length limit, EOS included", check=integer_in(1))
STOP = Setting((), "stop string, non-empty (repeatable): a completion ends right after the first of them",
               check=_stop_strings)


@dataclass(frozen=True)
class SamplingParams:
    """How the target's distribution is processed and when a completion ends."""

    temperature: float = TEMPERATURE.field()  # 0 = greedy
    top_k: int = TOP_K.field()  # 0 = off
    top_p: float = TOP_P.field()  # 1 = off
    max_new_tokens: int = MAX_NEW_TOKENS.field()  # completion tokens per row, EOS included
    stop: tuple[str, ...] = STOP.field()  # a completion ends right after the first of these strings


@dataclass(frozen=True)
class SpecConfig:
    """Which speculative mode runs and how deep it drafts (default: plain decoding, which needs no head)."""

    mode: str = MODE.field()  # none | to | rs (| auto: bebop.speculative.auto picks one)
    speculate_k: int | str = SPECULATE_K.field()  # K, drafts verified per target pass (| "auto", as for mode)
    draft_temperature: float | None = DRAFT_TEMPERATURE.field()  # temperature of q; None = the sampling temperature
    filter_drafts: bool = FILTER_DRAFTS.field()  # apply the sampling top-k/top-p to q too (drafts and verification)
    verify: str = VERIFY.field()  # token: token-wise rejection sampling | block: bebop.speculative.block (mode rs only)
    num_drafts: int = NUM_DRAFTS.field()  # n chains per row (bebop.speculative.multidraft; mode rs, verify token)
    recurrent_rollback: str = RECURRENT_ROLLBACK.field()  # snapshot | replay | auto: how recurrent layers roll back


# NOTE: the commands (generate, rl) and the TRL integration draft with the head unless told otherwise: rs is
# lossless, so the default rollout is the policy's own distribution, only faster.
ROLLOUT_SPEC = SpecConfig(mode="rs")


def distribution_problems(temperature: float, top_k: int, top_p: float, greedy_ok: bool) -> list[str]:
    """Why (temperature, top-k, top-p) cannot shape a distribution (empty when they can); see
    ``settings_problems``. ``bebop.speculative.sampling.logits_to_probs`` checks its arguments here."""
    problems = [temperature_problem(temperature, greedy_ok), TOP_K.check("top_k", top_k), TOP_P.check("top_p", top_p)]
    return [p for p in problems if p]


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


def num_drafts_problem(spec: SpecConfig, backend: str = "engine") -> str | None:
    """The one-line reason a usable ``spec.num_drafts`` (``NUM_DRAFTS``' check) cannot run with the spec's mode,
    verify and ``backend``, or None.

    Example: SpecConfig("to", 3, num_drafts=2) -> "num_drafts 2 needs mode rs and verify token (...)".
    """
    n = spec.num_drafts
    if NUM_DRAFTS.check("num_drafts", n) is not None or n == 1:
        return None
    if spec.mode != "rs" or spec.verify != "token":
        return (f"num_drafts {n} needs mode rs and verify token (multi-draft verification tests drafts "
                f"against the draft's q, chain by chain), got mode {spec.mode}, verify {spec.verify}")
    if backend != "engine":
        return f"num_drafts {n} needs backend engine: {backend} verifies one drafted chain per row"
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
    problems = []
    if spec is not None:
        # NOTE: mode none drafts nothing, so it ignores K; an unknown verify or rollback is named below
        problems += field_problems(spec, skip=("verify", "recurrent_rollback") + (
            ("speculate_k",) if spec.mode == "none" else ()))
        if not auto_ok and spec.mode == AUTO:
            problems.append(f"unknown mode {spec.mode!r}; choose one of {', '.join(MODES)}")
        if not auto_ok and spec.mode != "none" and spec.speculate_k == AUTO:
            problems.append(speculate_k_problem(spec.speculate_k, auto_ok=False))
        problems += [verify_problem(spec.mode, spec.verify), num_drafts_problem(spec)]
        if spec.recurrent_rollback not in ROLLBACK_CHOICES:
            problems.append(f"recurrent_rollback {spec.recurrent_rollback!r} is not one of {', '.join(ROLLBACK_CHOICES)}")
    if sampling is not None:
        problems += [temperature_problem(sampling.temperature, greedy_ok)] + field_problems(sampling,
                                                                                               skip=("temperature",))
    return [p for p in problems if p]


def check_settings(spec: SpecConfig | None, sampling: SamplingParams | None, greedy_ok: bool = True,
                   auto_ok: bool = True) -> None:
    """Raises BebopError (one line naming every problem) unless ``settings_problems`` finds none."""
    problems = settings_problems(spec, sampling, greedy_ok, auto_ok)
    if problems:
        raise BebopError("; ".join(problems))
