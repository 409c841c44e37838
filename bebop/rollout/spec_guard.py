"""A fail-closed guard: a serving engine's speculative-decoding settings are refused unless its
verification is lossless.

Bebop's rollouts are exact samples of the policy only if every draft is verified by rejection
sampling (accepted with probability min(1, p/q), a rejection resampled from norm(max(0, p - q))) or by
block verification, which is exact too. Serving engines also ship verifiers that trade exactness for
acceptance; a configuration naming one is refused in one line, whether Bebop builds it (the vLLM
backend) or reads it from a user (a trainer's arguments). ``LOSSY_SETTINGS`` lists them under vLLM's
key names across versions:

- ``rejection_sample_method`` (vLLM >= 0.11, V1): ``standard`` and ``block`` are exact; ``synthetic``
  (acceptance at preset rates, for benchmarks) and ``fly`` (FLy: a rejected draft kept where the
  target's entropy is high) are not; any other value is refused too, being unknown.
- ``synthetic_acceptance_rates`` / ``synthetic_acceptance_length`` and ``fly_entropy_threshold`` /
  ``fly_window_size``: the settings of those verifiers.
- ``acceptance_method`` (vLLM 0.8's speculative config) and ``spec_decoding_acceptance_method`` (the
  engine argument before it): ``rejection_sampler`` is exact, ``typical_acceptance_sampler``
  (Medusa's typical acceptance: a draft is kept when the target finds it plausible enough) is not.
- ``posterior_threshold`` / ``posterior_alpha`` and ``typical_acceptance_sampler_posterior_threshold``
  / ``typical_acceptance_sampler_posterior_alpha``: typical acceptance's thresholds.

Keys are matched with dashes or underscores (a CLI flag or a dict key), at the top level of the
settings and inside any value whose key names a speculative config (a dict, an object's fields, or a
JSON string, as ``vllm serve --speculative-config`` takes it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from bebop.utils.errors import BebopError

EXACT = "an exact verifier"  # the rule a refused setting breaks, named in every refusal
TYPICAL = "typical acceptance keeps a draft the target finds plausible enough, not with probability min(1, p/q)"
SYNTHETIC = "synthetic acceptance accepts drafts at preset rates whatever p and q are (a benchmarking mode)"
FLY = "FLy keeps a rejected draft where the target's entropy is high, so the output is not the target's"

# key -> (the values that are exact, or None: any value but unset is lossy; why the others are lossy)
LOSSY_SETTINGS: dict[str, tuple[tuple | None, dict[str, str] | str]] = {
    "rejection_sample_method": (("standard", "block"), {"synthetic": SYNTHETIC, "fly": FLY}),
    "synthetic_acceptance_rates": (None, SYNTHETIC),
    "synthetic_acceptance_length": (None, SYNTHETIC),
    "fly_entropy_threshold": (None, FLY),
    "fly_window_size": (None, FLY),
    "acceptance_method": (("rejection_sampler",), {"typical_acceptance_sampler": TYPICAL}),
    "spec_decoding_acceptance_method": (("rejection_sampler",), {"typical_acceptance_sampler": TYPICAL}),
    "posterior_threshold": (None, TYPICAL),
    "posterior_alpha": (None, TYPICAL),
    "typical_acceptance_sampler_posterior_threshold": (None, TYPICAL),
    "typical_acceptance_sampler_posterior_alpha": (None, TYPICAL),
}


def _items(settings) -> list[tuple[str, object]]:
    """(key, value) pairs of a mapping, a JSON object string or an object's fields; [] for anything else."""
    if isinstance(settings, str):
        try:
            settings = json.loads(settings)
        except ValueError:
            return []
    if isinstance(settings, Mapping):
        return [(str(k), v) for k, v in settings.items()]
    fields = getattr(settings, "__dict__", None)
    return [(k, v) for k, v in fields.items() if not k.startswith("_")] if isinstance(fields, dict) else []


def lossy_setting_problem(settings, where: str) -> str | None:
    """The line refusing the first lossy verification setting in ``settings``, or None when there is none.

    Args:
        settings: a speculative config or an engine's options (a dict, a JSON string, or an object such as
            a trainer's arguments); None passes.
        where: what the settings are, for the message (e.g. "vLLM speculative_config").

    Example: lossy_setting_problem({"rejection_sample_method": "synthetic"}, "speculative_config") ->
        "speculative_config: rejection_sample_method='synthetic' is refused: synthetic acceptance accepts ...:
        set rejection_sample_method='standard' or remove it."
    """
    for key, value in _items(settings):
        name = key.replace("-", "_").lower()
        if name in LOSSY_SETTINGS and value is not None:
            exact, why = LOSSY_SETTINGS[name]
            shown = str(value).lower()
            if exact is None or shown not in exact:
                reason = why if isinstance(why, str) else why.get(shown, f"not {' or '.join(exact)}, the values known "
                                                                           "to be exact")
                fix = "remove it" if exact is None else f"set {key}={exact[0]!r} or remove it"
                return (f"{where}: {key}={value!r} is refused: {reason}; Bebop's rollouts must be exact samples of the "
                        f"policy, so the engine needs {EXACT}: {fix}.")
        if "speculative" in name and not isinstance(value, (bool, int, float)):
            if problem := lossy_setting_problem(value, f"{where} {key}"):
                return problem
    return None


def check_lossless_verification(settings, where: str) -> None:
    """Raises BebopError (one line) when ``settings`` name a verifier that is not lossless (``lossy_setting_problem``)."""
    if problem := lossy_setting_problem(settings, where):
        raise BebopError(problem)
