"""The report's answer in words: sync and async runs apart, no "nan" for a run that ended in plain decoding,
advice in the words of the trainer that wrote the runs."""

from __future__ import annotations

import json
import re

from bebop.analysis.report import write_report
from tests.helpers.analysis import NUM_STEPS, fake_metrics


def _run(path, metrics, **config):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"mode": "none", "mtp_update": "frozen", **config}))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    return path


def _answer(text: str) -> str:
    return text[text.index("## The answer"):text.index("## The paper's findings")]


def _trl_dir(path, rows, mode="rs"):
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"log_history": rows}))
    (path / "bebop_rollout.json").write_text(json.dumps({"mode": mode, "speculate_k": 3, "mtp_loss": "e2e_tv"}))
    return path


def _trl_rows(accept):
    return [{"step": s, "loss": 0.1, "step_time": 2.0, "reward": 0.5, "spec/accept_length": a,
             "entropy": 0.3 + 0.01 * s} for s, a in enumerate(accept, start=1)]


def test_sync_and_async_runs_are_reported_apart(tmp_path):
    """An async rs run's step time is neither pooled with the sync rs runs' nor compared with a sync none run
    when an async one is given; each gets its own sentence and its own speed-up in the runs table."""
    runs = [_run(tmp_path / "none", fake_metrics("none", 0, 0, 2.0, 0)),
            _run(tmp_path / "none-async", fake_metrics("none", 0, 0, 1.6, 1), async_rollout=True),
            _run(tmp_path / "rs", fake_metrics("rs", -0.06, 3.6, 1.2, 2), mode="rs", mtp_loss="e2e_tv"),
            _run(tmp_path / "rs-async", fake_metrics("rs", -0.06, 3.6, 0.8, 3), mode="rs", mtp_loss="e2e_tv",
                 async_rollout=True)]
    text = write_report(runs, tmp_path / "out").read_text()
    answer = _answer(text)
    assert "with MTP (rs+e2e_tv) and 2 s without (none): a speed-up of 1.67×" in answer
    assert "with MTP (rs+e2e_tv+async) and 1.6 s without (none+async): a speed-up of 2.00×" in answer
    assert "pooled" not in answer
    row = next(line for line in text.splitlines() if line.startswith("| rs+e2e_tv+async |"))
    assert "| rs (async) |" in row and "| 2.00× [" in row


def test_an_auto_run_that_ended_in_plain_decoding_reads_without_nan(tmp_path):
    """A TRL auto run that chose plain decoding for its last steps logs no accept length there."""
    accept = [2.75] * 30 + [None] * 10
    run = _trl_dir(tmp_path / "trl", _trl_rows(accept), mode="auto")
    text = write_report([run], tmp_path / "out").read_text()
    answer = _answer(text)
    assert not re.search(r"\bnan\b", text, re.IGNORECASE)
    assert "2.75 over the first 20% of steps; the last 20% drafted nothing (plain decoding" in answer


def test_a_trl_report_gives_advice_in_trl_s_settings(tmp_path):
    """No baseline, or no speculative run: the advice names GRPOConfig, bebop_rollout_func and
    trainer.save_state(), not the flags of `bebop rl` or of the example script."""
    rs = _trl_dir(tmp_path / "rs", _trl_rows([2.5] * NUM_STEPS))
    answer = _answer(write_report([rs], tmp_path / "out-rs").read_text())
    assert "same `GRPOConfig` and seed without Bebop's `rollout_func`" in answer
    assert "`trainer.save_state()`" in answer and "--mode" not in answer
    plain = _trl_dir(tmp_path / "none", _trl_rows([None] * NUM_STEPS), mode="none")
    answer = _answer(write_report([plain], tmp_path / "out-none").read_text())
    assert "`rollout_func=bebop_rollout_func(HEAD, mode=\"rs\")`" in answer and "bebop rl" not in answer
