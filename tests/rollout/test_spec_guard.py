"""Tests for bebop.rollout.spec_guard: every lossy verifier setting is refused in one line, the exact ones and
Bebop's own configs pass, and the guard reads nested, JSON and CLI-spelled settings (fail closed)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bebop.rollout.spec_guard import LOSSY_SETTINGS, check_lossless_verification, lossy_setting_problem
from bebop.utils.errors import BebopError

REFUSED = [  # (settings, the key named, a word of the reason)
    ({"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}, "rejection_sample_method", "preset"),
    ({"rejection_sample_method": "fly"}, "rejection_sample_method", "entropy"),
    ({"rejection_sample_method": "lenient"}, "rejection_sample_method", "known to be exact"),
    ({"synthetic_acceptance_rates": [0.9, 0.5]}, "synthetic_acceptance_rates", "preset"),
    ({"synthetic_acceptance_length": 3.0}, "synthetic_acceptance_length", "preset"),
    ({"fly_entropy_threshold": 0.3}, "fly_entropy_threshold", "entropy"),
    ({"fly_window_size": 4}, "fly_window_size", "entropy"),
    ({"acceptance_method": "typical_acceptance_sampler"}, "acceptance_method", "plausible"),
    ({"spec_decoding_acceptance_method": "typical_acceptance_sampler"}, "spec_decoding_acceptance_method", "plausible"),
    ({"posterior_threshold": 0.09}, "posterior_threshold", "plausible"),
    ({"posterior_alpha": 0.3}, "posterior_alpha", "plausible"),
    ({"typical_acceptance_sampler_posterior_threshold": 0.09}, "typical_acceptance_sampler_posterior_threshold",
     "plausible"),
    ({"typical_acceptance_sampler_posterior_alpha": 0.3}, "typical_acceptance_sampler_posterior_alpha", "plausible"),
]


def test_every_listed_setting_has_a_refusal_case():
    assert {key for _, key, _ in REFUSED} == set(LOSSY_SETTINGS)


@pytest.mark.parametrize("settings, key, reason", REFUSED, ids=[f"{k}={v}" for s, k, _ in REFUSED for v in [s[k]]])
def test_a_lossy_verifier_is_refused_in_one_line(settings, key, reason):
    spec = {"method": "mtp", "num_speculative_tokens": 3, **settings}
    with pytest.raises(BebopError) as caught:
        check_lossless_verification(spec, "vLLM speculative_config")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"vLLM speculative_config: {key}=") and reason in message
    assert "Bebop's rollouts must be exact samples of the policy" in message and message.endswith(" it.")


@pytest.mark.parametrize("settings", [
    None, {}, {"method": "mtp", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"},
    {"method": "mtp", "num_speculative_tokens": 3},  # Bebop's mode to: greedy drafts, one-hot q, still exact
    {"rejection_sample_method": "standard"}, {"rejection_sample_method": "block"}, {"rejection_sample_method": "Standard"},
    {"acceptance_method": "rejection_sampler", "posterior_threshold": None, "synthetic_acceptance_rates": None},
    {"speculative_config": None, "dtype": "bfloat16", "enforce_eager": True},
    "not json", 3,
])
def test_exact_settings_pass(settings):
    assert lossy_setting_problem(settings, "x") is None
    check_lossless_verification(settings, "x")


def test_nested_json_and_cli_spellings_are_read():
    """Engine options holding the speculative config, a JSON string as `vllm serve --speculative-config` takes it,
    dashed CLI keys, and an object's fields (a trainer's or a server script's arguments)."""
    lossy = {"method": "mtp", "rejection_sample_method": "synthetic"}
    cases = [
        ({"dtype": "float32", "speculative_config": lossy}, "options speculative_config: rejection_sample_method="),
        ({"speculative-config": json.dumps(lossy)}, "options speculative-config: rejection_sample_method="),
        ({"spec-decoding-acceptance-method": "typical_acceptance_sampler"}, "options: spec-decoding-acceptance-method="),
        (SimpleNamespace(seed=0, vllm_speculative_config=json.dumps(lossy)), "options vllm_speculative_config: "),
        ({"speculative_config": SimpleNamespace(posterior_alpha=0.3)}, "options speculative_config: posterior_alpha=0.3"),
    ]
    for settings, start in cases:
        assert (lossy_setting_problem(settings, "options") or "").startswith(start), settings
    assert lossy_setting_problem({"draft": lossy}, "options") is None  # only speculative configs are opened


def test_trl_vllm_serve_arguments_are_judged():
    """`trl vllm-serve --speculative-config` fills ScriptArguments.speculative_config, a JSON string."""
    pytest.importorskip("trl")
    from trl.scripts.vllm_serve import ScriptArguments

    good = ScriptArguments(model="m", speculative_config='{"method": "mtp", "num_speculative_tokens": 3, '
                                                         '"draft_sample_method": "probabilistic"}')
    assert lossy_setting_problem(good, "trl vllm-serve") is None
    bad = ScriptArguments(model="m", speculative_config='{"method": "mtp", "rejection_sample_method": "fly"}')
    assert "rejection_sample_method='fly' is refused" in lossy_setting_problem(bad, "trl vllm-serve")


def test_the_documented_configs_pass():
    from tests.integrations.test_trainer_docs import _speculative_configs

    for config in _speculative_configs():
        check_lossless_verification(config, "docs/trainers.md")


def test_the_trl_rollout_refuses_a_lossy_verifier_before_sampling(tmp_path):
    pytest.importorskip("trl")
    from bebop.integrations.trl import sampling_params
    from tests.helpers.engine import peaked_model
    from tests.integrations.test_trl import make_trainer

    model = peaked_model()
    trainer = make_trainer(tmp_path, model)
    trainer.args.vllm_speculative_config = {"method": "mtp", "acceptance_method": "typical_acceptance_sampler"}
    with pytest.raises(BebopError, match=r"^GRPOConfig vllm_speculative_config: acceptance_method="):
        sampling_params(trainer, model)
