"""The rollout-backend contract: checks every backend must pass (engine here, vLLM in tests/vllm).

Each function takes a backend made on (model, tokenizer, head) and raises AssertionError on a breach.
"""

from __future__ import annotations

from bebop.speculative.completions import ABSENT_WITHOUT_TOKEN_STATS
from bebop.speculative import SamplingParams, SpecConfig

FINISH_REASONS = {"eos", "length", "stop"}


def check_completions(backend, tokenizer, prompts: list[list[int]], mode: str, k: int, group_size: int = 3,
                      max_new_tokens: int = 12, temperature: float = 1.0) -> None:
    """Shapes, order, texts, finish reasons and the SpecStats counts of one rollout."""
    sampling = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)
    out = backend.rollout(prompts, sampling, SpecConfig(mode, k), group_size=group_size, seed=1, step=2)
    rows = len(prompts) * group_size
    assert len(out.prompt_ids) == len(out.token_ids) == len(out.texts) == len(out.lengths) == rows
    assert len(out.finish_reasons) == rows
    eos = tokenizer.eos_token_id
    for row in range(rows):
        ids = out.token_ids[row]
        assert out.prompt_ids[row] == list(prompts[row // group_size]), f"row {row} is not prompt-major"
        assert out.lengths[row] == len(ids) and 1 <= len(ids) <= max_new_tokens
        assert out.texts[row] == tokenizer.decode(ids, skip_special_tokens=True)
        reason = out.finish_reasons[row]
        assert reason in FINISH_REASONS
        assert (reason == "eos") == (ids[-1] == eos), f"row {row}: {reason} but last token {ids[-1]}"
        if reason == "length":
            assert len(ids) == max_new_tokens
        assert eos not in ids[:-1], f"row {row} goes on after EOS"
    stats = out.stats
    assert stats.speculate_k == (k if mode != "none" else 0)
    assert stats.num_generated_tokens == sum(out.lengths)
    if mode == "none":
        assert stats.num_drafts == 0
    else:
        assert stats.num_drafts > 0 and stats.num_draft_tokens == k * stats.num_drafts
        conventions = [(stats.verifier_accepted_per_pos, stats.verifier_num_accepted_tokens)]  # before the stop check
        if backend.token_stats:  # emitted tokens per position: only a backend that sees every step's tokens
            conventions.append((stats.accepted_per_pos, stats.num_accepted_tokens))
        for per_pos, accepted in conventions:
            assert len(per_pos) == k and sum(per_pos) == accepted
            assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))
        assert stats.num_drafts <= stats.verifier_num_drafts  # the stop check only drops
        assert 0 <= stats.num_accepted_tokens <= stats.verifier_num_accepted_tokens
    metrics = out.spec_metrics()
    assert out.token_stats == backend.token_stats
    for key in ABSENT_WITHOUT_TOKEN_STATS:
        assert (metrics[key] is None) == (not backend.token_stats), key


def check_greedy_modes_agree(backend, prompts: list[list[int]], k: int, max_new_tokens: int = 16) -> list[list[int]]:
    """At T = 0 modes none, to and rs emit the same tokens; returns them."""
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    outs = {mode: backend.rollout(prompts, sampling, SpecConfig(mode, k)).token_ids for mode in ("none", "to", "rs")}
    assert outs["none"] == outs["to"] == outs["rs"], outs
    return outs["none"]


def check_sync(backend, new_model, prompts: list[list[int]], expected: list[list[int]], k: int,
               max_new_tokens: int = 16) -> None:
    """After ``sync(new_model)``, greedy rs output equals ``expected`` (new_model's greedy tokens)."""
    backend.sync(new_model)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    got = backend.rollout(prompts, sampling, SpecConfig("rs", k)).token_ids
    assert got == expected, "the backend did not sample with the synced weights"
