"""TRL output directories read as runs: log history rows, per-position keys, the newest checkpoint, bad files."""

from __future__ import annotations

import json

import pytest

from bebop.analysis.runs import load_run, trl_metrics_row
from bebop.utils.io import BebopError


def test_trl_metrics_row_maps_keys_and_positions():
    row = trl_metrics_row({"step": 3, "reward": 0.5, "step_time": 2.0, "spec/target_entropy": 1.2,
                           "spec/alpha_rs/1": 0.9, "spec/alpha_rs/2": 0.8, "spec/accepted_per_pos/1": 0.7})
    assert row["accuracy"] == 0.5 and row["step_s"] == 2.0 and row["target_entropy"] == 1.2
    assert row["spec/alpha_rs"] == [0.9, 0.8] and row["spec/accepted_per_pos"] == [0.7]
    assert trl_metrics_row({"step": 1, "entropy": 0.4})["target_entropy"] == 0.4  # TRL's own entropy without Bebop
    # TRL logs null for a metric that was NaN on every call (Bebop's vLLM backend measures no entropy)
    assert trl_metrics_row({"step": 1, "spec/target_entropy": None, "entropy": 0.4})["target_entropy"] == 0.4


def _history(steps):
    return [{"step": s, "loss": 0.1, "spec/accept_length": 2.0 + s / 10} for s in steps] + [{"step": steps[-1],
                                                                                              "train_runtime": 1.0}]


def test_load_trl_run_from_state_and_newest_checkpoint(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": _history([2, 1])}))
    (tmp_path / "bebop_rollout.json").write_text(json.dumps({"mode": "rs", "speculate_k": 3, "mtp_loss": "e2e_tv"}))
    run = load_run(tmp_path)
    assert [m["step"] for m in run.metrics] == [1, 2] and run.label == "trl:rs+e2e_tv" and run.token_stats is None
    ckpt = tmp_path / "ckpt"
    for n, steps in ((5, [1]), (10, [1, 2, 3])):
        (ckpt / f"checkpoint-{n}").mkdir(parents=True)
        (ckpt / f"checkpoint-{n}" / "trainer_state.json").write_text(json.dumps({"log_history": _history(steps)}))
    assert len(load_run(ckpt).metrics) == 3 and load_run(ckpt).config["mode"] == "none"


def test_bad_trl_history_is_one_line(tmp_path):
    (tmp_path / "log_history.json").write_text(json.dumps({"not": "a list"}))
    with pytest.raises(BebopError, match="not a list of objects"):
        load_run(tmp_path)
    (tmp_path / "log_history.json").write_text(json.dumps([{"train_runtime": 1.0}]))
    with pytest.raises(BebopError, match="no steps"):
        load_run(tmp_path)
    (tmp_path / "log_history.json").write_text("{torn")
    with pytest.raises(BebopError):
        load_run(tmp_path)
