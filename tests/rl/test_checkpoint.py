"""bebop.rl.checkpoint: a run stopped after a checkpoint (or mid-append) and resumed logs what an unbroken run logs."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from bebop.mtp.head import MtpHead
from bebop.rl.checkpoint import load_checkpoint, rng_state, save_checkpoint, set_rng_state
from bebop.rl.loop import train_rl
from bebop.utils.errors import BebopError
from tests.helpers.rl import TIMING_KEYS, read_rows, tiny_config, tiny_policy


def _without_timing(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def _run(run_dir, resume: bool = False, **overrides) -> dict:
    """A fresh tiny policy and head (rebuilt from their configs, as after a crash), then train_rl."""
    model, tok = tiny_policy()
    train_rl(model, tok, MtpHead(model), tiny_config(save_every=2, **overrides), run_dir, resume=resume,
             show_progress=False)
    return model.state_dict()


@pytest.mark.parametrize(
    "overrides",
    [
        {"mode": "rs"},
        # every optional component at once: online head + its optimizer, reference, async snapshot
        {"mode": "to", "mtp_update": "online", "mtp_lr": 1e-2, "kl_coef": 0.1, "async_rollout": True},
    ],
    ids=["rs-frozen", "to-online-kl-async"],
)
def test_resume_matches_unbroken_run(tmp_path, overrides):
    unbroken = _run(tmp_path / "a", steps=4, **overrides)
    _run(tmp_path / "b", steps=2, **overrides)  # stops right after its step-2 checkpoint
    with (tmp_path / "b" / "metrics.jsonl").open("a") as f:  # a row a killed run logged after it
        f.write(json.dumps({"step": 3, "reward_mean": -1.0}) + "\n")
    resumed = _run(tmp_path / "b", resume=True, steps=4, **overrides)
    rows_a, rows_b = (read_rows(tmp_path / d / "metrics.jsonl") for d in ("a", "b"))
    assert [r["step"] for r in rows_b] == [1, 2, 3, 4]
    for row_a, row_b in zip(_without_timing(rows_a), _without_timing(rows_b)):
        assert row_a == row_b, f"step {row_a['step']} differs"
    assert read_rows(tmp_path / "a" / "token_stats.jsonl") == read_rows(tmp_path / "b" / "token_stats.jsonl")
    assert all(torch.equal(v, resumed[k]) for k, v in unbroken.items())


def test_resume_past_a_torn_last_line(tmp_path):
    """A kill in the middle of appending a (long) log line leaves a partial last line: resume drops it."""
    unbroken = _run(tmp_path / "a", steps=4, mode="rs")
    _run(tmp_path / "b", steps=2, mode="rs")
    for name in ("metrics.jsonl", "token_stats.jsonl"):
        with (tmp_path / "b" / name).open("a") as f:
            f.write(json.dumps({"step": 3, "position": list(range(100))})[:150])  # no newline: cut short
    resumed = _run(tmp_path / "b", resume=True, steps=4, mode="rs")
    rows_a, rows_b = (read_rows(tmp_path / d / "metrics.jsonl") for d in ("a", "b"))
    assert _without_timing(rows_a) == _without_timing(rows_b)
    assert read_rows(tmp_path / "a" / "token_stats.jsonl") == read_rows(tmp_path / "b" / "token_stats.jsonl")
    assert all(torch.equal(v, resumed[k]) for k, v in unbroken.items())


def test_torn_line_in_the_middle_is_an_error(tmp_path):
    _run(tmp_path, steps=2, mode="rs")
    path = tmp_path / "metrics.jsonl"
    first, second = path.read_text().splitlines(keepends=True)
    path.write_text(first[:40] + "\n" + second)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(BebopError, match="line 1 is not valid JSON"):
        _run(tmp_path, resume=True, steps=4, mode="rs")
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before, "nothing may change"


def test_resume_refuses_a_changed_config(tmp_path):
    _run(tmp_path, steps=2, mode="rs")
    with pytest.raises(BebopError, match="lr") as refused:
        _run(tmp_path, resume=True, steps=4, mode="rs", lr=5e-4)
    message = str(refused.value)  # a whole sentence: what may change, and what to do for the rest
    assert "may change only steps, save_every" in message and message.endswith("or another run directory)")


def test_resume_without_checkpoint_starts_over(tmp_path):
    _run(tmp_path, resume=True, steps=1, mode="none")
    assert [r["step"] for r in read_rows(tmp_path / "metrics.jsonl")] == [1]


def test_checkpoint_round_trips_components_and_rng(tmp_path):
    layer = torch.nn.Linear(3, 2)
    opt = torch.optim.AdamW(layer.parameters(), lr=0.1)
    layer(torch.ones(1, 3)).sum().backward()
    opt.step()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    save_checkpoint(tmp_path, {"layer": layer, "opt": opt}, step=7, config={"lr": 0.1})
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    other = torch.nn.Linear(3, 2)
    other_opt = torch.optim.AdamW(other.parameters(), lr=0.1)
    assert load_checkpoint(tmp_path, {"layer": other, "opt": other_opt}, {"lr": 0.1}) == 7
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected
    assert torch.equal(other.weight, layer.weight)
    assert torch.equal(other_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    with pytest.raises(BebopError, match="lacks"):
        load_checkpoint(tmp_path, {"head": other}, {"lr": 0.1})


def test_rng_state_survives_torch_save(tmp_path):
    state = rng_state()
    torch.save(state, tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == first


def test_checkpoint_of_another_model_is_one_line(tmp_path):
    save_checkpoint(tmp_path, {"policy": torch.nn.Linear(2, 2)}, 1, {"a": 1})
    with pytest.raises(BebopError, match=r"policy.pt does not fit this run's policy: .*size mismatch") as info:
        load_checkpoint(tmp_path, {"policy": torch.nn.Linear(3, 3)}, {"a": 1})
    assert "\n" not in str(info.value)
