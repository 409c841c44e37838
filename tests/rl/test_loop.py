"""bebop.rl.loop and bebop.rl.config on a tiny random Qwen3 with the embedded tokenizer (V = 218).

A random policy almost never solves the embedded task, so the runs here score completions with
``char_length_reward`` (a dense reward with spread inside every group); the task's own reward is
exercised through ``score_rollout``.
"""

from __future__ import annotations

import json

import pytest
import torch

from bebop.analysis.runs import load_run
from bebop.analysis.summary import summarize_run
from bebop.mtp.head import MtpHead
from bebop.rl import RLConfig, config_fields, flat_config, resolve_rl_config, train_rl
from bebop.rl.loop import Rollout, make_state, rl_step, score_rollout
from bebop.rl.prompts import prompt_batch, step_seed
from bebop.rollout.runner import PromptBatch
from bebop.speculative.completions import Completions
from bebop.task import arith
from bebop.utils.errors import BebopError
from tests.helpers.rl import char_length_reward, read_rows, tiny_config, tiny_policy

# ------------------------------------------------------------------------------ config


def test_config_precedence_and_flat_keys(tmp_path):
    path = tmp_path / "rl.toml"
    path.write_text("# bebop rl --config rl.toml\nmode = 'to'\nlr = 2e-5\nmtp_lr = 3\ngroup_size = 4\n")
    cfg = resolve_rl_config(path, {"group_size": 6, "steps": None})
    assert (cfg.spec.mode, cfg.policy.lr, cfg.mtp.mtp_lr, cfg.group_size, cfg.steps) == ("to", 2e-5, 3.0, 6, 100)
    assert set(flat_config(cfg)) == set(config_fields())
    assert resolve_rl_config(None, flat_config(cfg)) == cfg  # config.json round-trips


def test_every_field_has_help():
    fields = config_fields()
    assert len(fields) == len(flat_config(RLConfig()))
    assert all(flag.help for flag in fields.values())


@pytest.mark.parametrize("overrides", [{"lrr": 1.0}, {"policy": {}}, {"lr": "fast"}, {"mode": "greedy"},
                                       {"temperature": 0.0}, {"group_size": 1}, {"task": "math"},
                                       {"online_loss": "mse"}])
def test_bad_config_raises(overrides):
    with pytest.raises(BebopError):
        resolve_rl_config(None, overrides)


def test_unknown_file_key_raises(tmp_path):
    path = tmp_path / "rl.yaml"
    path.write_text("steps: 3\nspeculate-k: 2\n")
    with pytest.raises(BebopError, match="speculate-k"):
        resolve_rl_config(path)


# ------------------------------------------------------------------------------ prompts and reward


def test_embedded_prompts_depend_on_seed_and_step_only():
    cfg = tiny_config(prompts_per_step=3)
    batch = prompt_batch(cfg, 5, None)
    problems = arith.make_problems(3, seed=step_seed(cfg.seed, 5))
    assert batch.prompts == [p.prompt for p in problems]
    assert batch.fields == {"answer": [p.answer for p in problems]}
    assert prompt_batch(cfg, 6, None).prompts != batch.prompts


def test_math_rows_cycle_by_step():
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(5)]
    cfg = tiny_config(prompts_per_step=2)
    got = [prompt_batch(cfg, step, rows) for step in range(3)]
    assert [b.prompts for b in got] == [["p0", "p1"], ["p2", "p3"], ["p4", "p0"]]
    assert got[2].fields == {"answer": ["4", "0"]}


def test_score_rollout_repeats_prompts_and_fields_per_sample():
    batch = PromptBatch(0, ["Q 1 + 2 = ?", "Q 3 + 4 = ?"], {"answer": ["3", "7"]})
    texts = ["take 1 . A 3", "A 4", "A 7", "nothing"]
    result = Completions([[1]] * 4, [[1]] * 4, texts, [1] * 4, ["eos"] * 4)
    rewards = score_rollout(arith.arith_reward, Rollout(batch, result, 0.0), group_size=2)
    assert rewards.tolist() == [1.0, 0.0, 1.0, 0.0]


# ------------------------------------------------------------------------------ runs


@pytest.mark.parametrize("mode", ["none", "to", "rs"])
def test_run_trains_policy_keeps_frozen_head_and_logs(tmp_path, mode):
    model, tok = tiny_policy()
    head = MtpHead(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    head_before = {k: v.clone() for k, v in head.state_dict().items()}
    rows = train_rl(model, tok, head, tiny_config(mode=mode), tmp_path, show_progress=False)
    # NOTE: tied embeddings: named_parameters lists the shared embedding/lm_head matrix once.
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert not unchanged, f"policy parameters that did not move: {unchanged}"
    assert all(torch.equal(v, head.state_dict()[k]) for k, v in head_before.items()), "frozen head changed"
    assert len(rows) == 2 and all(torch.isfinite(torch.tensor(r["rl/loss"])) for r in rows)
    assert read_rows(tmp_path / "metrics.jsonl") == rows
    spec_keys = [k for k in rows[0] if k.startswith("spec/")]
    assert {"spec/accept_length", "spec/alpha_rs", "spec/alpha_to", "spec/num_drafts"} <= set(spec_keys)
    assert rows[0]["target_entropy"] > 0
    if mode == "none":
        assert all(rows[0][k] is None for k in spec_keys)
        assert not (tmp_path / "token_stats.jsonl").exists()
    else:
        assert rows[0]["spec/accept_length"] >= 1 and len(rows[0]["spec/alpha_rs"]) == 3
        stats = read_rows(tmp_path / "token_stats.jsonl")
        assert [s["step"] for s in stats] == [1, 2]
        assert len(stats[0]["position"]) == len(stats[0]["row"]) == len(stats[0]["entropy"]) == len(stats[0]["alpha_rs"]) > 0
    config = json.loads((tmp_path / "config.json").read_text())
    assert {"mode", "mtp_loss", "mtp_update", "online_loss", "speculate_k", "label"} <= set(config)
    summary = summarize_run(load_run(tmp_path))
    assert summary["num_steps"] == 2 and summary["mode"] == mode


def test_rl_step_is_on_policy_when_sync(tmp_path):
    model, tok = tiny_policy()
    cfg = tiny_config(mode="none", update_epochs=2)
    state = make_state(model, tok, None, cfg)
    metrics, rollout = rl_step(state, prompt_batch(cfg, 0, None), cfg)
    assert len(rollout.result.texts) == cfg.prompts_per_step * cfg.group_size
    assert metrics["step"] == 1 and metrics["rl/grad_norm"] > 0
    assert all(p.grad is None for p in model.parameters()), "gradients are freed after the update"


def test_async_rollout_runs_and_logs_the_same_keys(tmp_path):
    rows = {}
    for name, is_async in (("sync", False), ("async", True)):
        model, tok = tiny_policy()
        cfg = tiny_config(mode="rs", steps=3, async_rollout=is_async)
        rows[name] = train_rl(model, tok, MtpHead(model), cfg, tmp_path / name, show_progress=False)
    sync, asyn = rows["sync"], rows["async"]
    assert [list(r) for r in sync] == [list(r) for r in asyn]
    # Step 1 is sampled by the initial weights in both runs; later async steps by the weights one
    # update behind, so their importance ratio leaves 1 while the sync ratio stays 1.
    assert sync[0]["reward_mean"] == asyn[0]["reward_mean"]
    assert all(abs(r["rl/ratio_mean"] - 1.0) < 1e-6 for r in sync)
    assert all(abs(r["rl/ratio_mean"] - 1.0) > 1e-6 for r in asyn[1:])


def _two_sgd_steps(micro_batch_tokens: int, **overrides):
    """Two rl_steps (the second's prompts launched with the first, as train_rl does) with SGD at rate 0.5 in
    place of AdamW, whose first step g / |g| would amplify the rounding of near-zero gradient entries.
    Returns (metrics rows, rollout tokens, policy weights, head weights)."""
    from bebop.rl.loop import close_state
    from bebop.utils.torch_utils import seed_everything

    cfg = tiny_config(mode="rs", prompts_per_step=2, group_size=3, max_new_tokens=10,
                      micro_batch_tokens=micro_batch_tokens, **overrides)
    model, tok = tiny_policy()
    seed_everything(cfg.seed)
    head = MtpHead(model)
    state = make_state(model, tok, head, cfg)
    state.optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    if state.head_optimizer is not None:
        state.head_optimizer = torch.optim.SGD(head.parameters(), lr=0.5)
    rows, tokens = [], []
    try:
        for step in range(2):
            row, rollout = rl_step(state, prompt_batch(cfg, step, None), cfg, prompt_batch(cfg, step + 1, None))
            rows.append(row)
            tokens.append(rollout.result.token_ids)
    finally:
        close_state(state)
    return rows, tokens, model.state_dict(), head.state_dict()


@pytest.mark.parametrize("overrides", [{"kl_coef": 0.1}, {"async_rollout": True, "mtp_update": "online"}],
                         ids=["sync-kl", "async-online"])
def test_micro_batches_give_the_one_batch_update(overrides):
    """One row per micro-batch (a budget of 1 token) against the whole batch at once: the same rollouts, the
    same metrics and the same weights after two steps (float32 rounding). Covers the reference's and the
    sampling snapshot's logprobs (async), and the online head step in micro-batches."""
    whole, parts = _two_sgd_steps(100_000, **overrides), _two_sgd_steps(1, **overrides)
    assert parts[1] == whole[1]
    for row_parts, row_whole in zip(parts[0], whole[0]):
        for key in ("rl/loss", "rl/policy_loss", "rl/kl", "rl/clip_fraction", "rl/ratio_mean", "mtp/loss"):
            if row_whole[key] is not None:
                assert row_parts[key] == pytest.approx(row_whole[key], abs=1e-6), key
        assert row_parts["rl/grad_norm"] == pytest.approx(row_whole["rl/grad_norm"], rel=1e-5)
    assert whole[0][1]["rl/kl"] > 0 if "kl_coef" in overrides else whole[0][1]["rl/ratio_mean"] != 1.0
    for got, want in ((parts[2], whole[2]), (parts[3], whole[3])):
        for key, value in want.items():
            torch.testing.assert_close(got[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_kl_penalty_uses_a_frozen_reference(tmp_path):
    model, tok = tiny_policy()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = tiny_config(mode="none", steps=3, kl_coef=0.5)
    state = make_state(model, tok, None, cfg)
    kls = [rl_step(state, prompt_batch(cfg, s, None), cfg)[0]["rl/kl"] for s in range(cfg.steps)]
    assert kls[0] == pytest.approx(0.0, abs=1e-6) and kls[-1] > 0
    assert all(torch.equal(v, state.reference.state_dict()[k]) for k, v in initial.items())


def test_speculative_mode_without_head_raises(tmp_path):
    model, tok = tiny_policy()
    with pytest.raises(BebopError, match="needs an MTP head"):
        train_rl(model, tok, None, tiny_config(mode="rs"), tmp_path, show_progress=False)


@pytest.mark.parametrize("auto", [{"mode": "auto"}, {"speculate_k": "auto"}])
def test_auto_is_refused_under_torchrun(tmp_path, monkeypatch, auto):
    """Each rank would time, hence choose, on its own: refused before anything is written."""
    from bebop.utils import distributed

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    model, tok = tiny_policy()
    cfg = resolve_rl_config(None, {**flat_config(tiny_config(mode="rs")), **auto})
    with pytest.raises(BebopError, match="auto does not run under torchrun"):
        train_rl(model, tok, MtpHead(model), cfg, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()


def test_mode_none_with_k_auto_is_not_auto_under_torchrun(tmp_path, monkeypatch):
    """``--mode none --speculate-k auto`` is plain decoding (``bebop.config.is_auto``): torchrun's auto
    refusal lets it through to the next check (here stopped at the run directory's)."""
    from bebop.rl import loop
    from bebop.utils import distributed

    class Passed(Exception):
        pass

    def stop(*args, **kwargs):
        raise Passed

    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    monkeypatch.setattr(loop, "check_output_dir", stop)
    model, tok = tiny_policy()
    cfg = resolve_rl_config(None, {**flat_config(tiny_config(mode="none")), "speculate_k": "auto"})
    with pytest.raises(Passed):
        train_rl(model, tok, None, cfg, tmp_path / "run", show_progress=False)


def answer_echo_reward(prompts: list[str], completions: list[str], answer: list[str], **_: list) -> list[float]:
    """Test reward that checks the data rows' extra field arrives once per completion."""
    assert len(answer) == len(completions) == len(prompts)
    assert answer == [str(int(p.split()[1]) + 1) for p in prompts], "answer must stay aligned with its prompt"
    return char_length_reward(prompts, completions)


def test_math_task_reads_a_prompt_file(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"Q {i} + 1 = ?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    model, tok = tiny_policy()
    cfg = tiny_config(mode="none", task="math", data=str(data), reward="tests.rl.test_loop:answer_echo_reward", steps=2)
    rows = train_rl(model, tok, None, cfg, tmp_path / "run", show_progress=False)
    assert [r["step"] for r in rows] == [1, 2]
