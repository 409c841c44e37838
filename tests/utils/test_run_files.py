"""bebop.utils.run_files: the token-statistics row, the scalar spelling of metrics and its inverse, repeated steps,
and the text a report may show from a received file."""

from __future__ import annotations

import math

import pytest
import torch

from bebop.speculative.stats import SpecStats
from bebop.utils.errors import BebopError
from bebop.utils.run_files import (
    check_token_stats,
    json_safe,
    last_of_each_step,
    listed_metrics,
    scalar_metrics,
    shown_text,
    token_stats_row,
)


def test_token_stats_row_from_spec_stats_is_strict_json_and_checks():
    stats = SpecStats(speculate_k=2)
    stats.record_positions(torch.tensor([1, 2, 1]), torch.tensor([0, 0, 3]), torch.tensor([0.5, float("nan"), 1.0]),
                           torch.tensor([0.9, 0.8, 0.7]), torch.tensor([0.6, 0.5, 0.4]))
    row = token_stats_row(4, stats.token_arrays())
    assert row["step"] == 4 and "rollout" not in row and row["position"] == [1, 2, 1] and row["row"] == [0, 0, 3]
    assert row["entropy"][1] is None  # NaN -> null
    assert token_stats_row(4, stats.token_arrays(), rollout=2)["rollout"] == 2
    assert check_token_stats([row], "f") == [row]
    with pytest.raises(BebopError, match="row 1 has lists of different lengths"):
        check_token_stats([{**row, "alpha_rs": [0.1]}], "f")
    with pytest.raises(BebopError, match="lacks one of the lists"):
        check_token_stats([{"step": 1}], "f")


def test_scalar_metrics_and_listed_metrics_are_inverse_for_spec_stats():
    stats = SpecStats(speculate_k=3)
    stats.num_drafts, stats.num_accepted_tokens, stats.accepted_per_pos = 4, 5, [3, 2, 0]
    metrics = stats.to_metrics()
    flat = scalar_metrics({**metrics, "auto/probed": True, "auto/predicted_tok_s": None})
    assert all(isinstance(v, float) for v in flat.values())  # what TRL's logger averages
    assert flat["spec/accepted_per_pos/2"] == 0.5 and flat["auto/probed"] == 1.0
    assert math.isnan(flat["auto/predicted_tok_s"])
    assert "spec/accept_length_hist/4" in flat and "spec/accept_length_hist/5" not in flat
    back = listed_metrics(json_safe(flat))
    for key, value in metrics.items():
        if isinstance(value, list):
            assert back[key] == json_safe(value), key
    assert listed_metrics({"spec/alpha_rs/2": 0.8})["spec/alpha_rs"] == [None, 0.8]  # a depth TRL did not log


def test_last_of_each_step_keeps_the_resumed_runs_rows():
    rows = [{"step": s, "n": i} for i, s in enumerate([1, 2, 3, 2, 3, 4])]
    kept, dropped = last_of_each_step(rows)
    assert [(r["step"], r["n"]) for r in kept] == [(1, 0), (2, 3), (3, 4), (4, 5)] and dropped == 2
    several = [{"step": 1}, {"step": 1, "rollout": 2}, {"step": 2}]  # two rollouts in step 1: both kept
    assert last_of_each_step(several) == (several, 0)


def test_shown_text_escapes_html_of_a_received_file():
    assert shown_text({"mtp_loss": "<img src=x onerror=alert(1)>", "k": [3, "a\nb"]}) == {
        "mtp_loss": "&lt;img src=x onerror=alert(1)&gt;", "k": [3, "a b"]}
    links = "[x](javascript:alert(1)) ![i](javascript:f)"  # no link or image may form in the report
    assert shown_text(links) == r"\[x\](javascript:alert(1)) !\[i\](javascript:f)"
