"""Tests for bebop.analysis.findings: each finding reproduced, not reproduced, inconclusive, not comparable.

Synthetic inputs are built so the verdict is unambiguous (slopes far from the thresholds and
noise tiny, or, for inconclusive, a slope near the threshold buried in noise); the bootstrap's
seed is fixed, so no test depends on a lucky draw.
"""

import json
import math

import numpy as np
import pytest

from bebop.analysis.findings import (
    INCONCLUSIVE,
    NOT_COMPARABLE,
    NOT_REPRODUCED,
    REPRODUCED,
    VERDICTS,
    Finding,
    chain_weights,
    compute_findings,
    findings_section,
    findings_table,
)
from bebop.analysis.fit import expected_accept_length
from bebop.analysis.runs import Run, load_run
from bebop.analysis.slopes import token_estimate
from tests.helpers.analysis import K, fake_head_evals, fake_sweep

NUM_STEPS = 30
# --------------------------------------------------------------------------------------------
# Synthetic inputs
# --------------------------------------------------------------------------------------------


def _metrics(slope, intercept=3.6, entropy=(0.2, 0.5), step_s=1.0, rollout_s=0.6, drift=0.0, spec=True,
             noise=0.005, seed=0):
    """One row per RL step: accept length = intercept + slope * H + drift * step/S + noise."""
    rng = np.random.default_rng(seed)
    h = np.linspace(*entropy, NUM_STEPS)  # (S,)
    accept = intercept + slope * h + drift * np.arange(NUM_STEPS) / NUM_STEPS + rng.normal(0, noise, NUM_STEPS)
    rows = []
    for s in range(NUM_STEPS):
        row = {"step": s + 1, "target_entropy": float(h[s]), "step_s": step_s, "rollout_s": rollout_s,
               "train_s": step_s - rollout_s}
        if spec:
            row["spec/accept_length"] = float(accept[s])
        rows.append(row)
    return rows


def _token_stats(alpha_to_slope=-0.5, alpha_rs_slope=-0.3, num_steps=3, per_step=300):
    """token_stats rows: alpha_j = a_j + slope * H at depths j = 1..K, tiny noise; 20 completions per step."""
    rng = np.random.default_rng(1)
    rows = []
    for s in range(num_steps):
        pos = np.tile(np.arange(1, K + 1), per_step // K)  # (N,)
        h = rng.uniform(0.0, 1.0, pos.size)
        base = 0.95 - 0.05 * pos
        rows.append({"step": s + 1, "position": pos.tolist(), "row": (np.arange(pos.size) // K % 20).tolist(),
                     "entropy": h.tolist(),
                     "alpha_rs": (base + alpha_rs_slope * h + rng.normal(0, 0.002, pos.size)).tolist(),
                     "alpha_to": (base - 0.1 + alpha_to_slope * h + rng.normal(0, 0.002, pos.size)).tolist()})
    return rows


def _run(mode, loss, metrics, update="frozen", online_loss="e2e_tv", token_stats=None):
    config = {"mode": mode, "mtp_loss": loss, "mtp_update": update, "online_loss": online_loss, "speculate_k": K}
    return Run(f"{mode}+{loss}+{update}", config, metrics, token_stats)


def _runs(to_slope=-1.7, ce_slope=-1.6, tv_slope=-0.02, entropy=(0.2, 0.5), online_drift=-0.4,
          none_step_s=1.8, token_stats=False, noise=0.005):
    """The demo's five runs; each role can be made to pass or fail its finding (own noise seed per run)."""
    stats = _token_stats() if token_stats else None
    return [
        _run("none", "e2e_tv", _metrics(0.0, step_s=none_step_s, rollout_s=0.8 * none_step_s, spec=False)),
        _run("to", "ce", _metrics(to_slope, entropy=entropy, noise=noise, seed=1), token_stats=stats),
        _run("rs", "ce", _metrics(ce_slope, entropy=entropy, noise=noise, seed=2), token_stats=stats),
        _run("rs", "e2e_tv", _metrics(tv_slope, intercept=3.8, entropy=entropy, noise=noise, seed=3)),
        _run("rs", "e2e_tv", _metrics(tv_slope, intercept=3.8, entropy=entropy, drift=online_drift, noise=noise,
                                      seed=4), update="online", online_loss="ce"),
    ]


def _by_number(findings):
    return {f.number: f for f in findings}


# --------------------------------------------------------------------------------------------
# All reproduced, and the table
# --------------------------------------------------------------------------------------------


def test_all_findings_reproduced_on_paper_like_data():
    findings = compute_findings(fake_head_evals(), fake_sweep(), _runs())
    assert [f.number for f in findings] == list(range(1, 9))
    assert all(isinstance(f, Finding) and f.verdict in VERDICTS for f in findings)
    assert {f.number: f.verdict for f in findings} == dict.fromkeys(range(1, 9), REPRODUCED)
    f = _by_number(findings)
    assert "RL steps" in f[1].note and "RL steps" in f[2].note  # the preferred source decides
    assert "order e2e_tv > tv > rkl > fkl ≈ ce" in f[3].ours
    assert "+2.0 / +3.5 / +5.0" in f[4].ours
    assert "1.80×" in f[7].ours


def test_table_has_one_row_per_finding_and_the_notes():
    findings = compute_findings(fake_head_evals(), {}, [])
    text = findings_table(findings)
    lines = text.splitlines()
    assert lines[0] == "| # | finding | paper | ours | verdict |"
    rows = [line for line in lines[2:] if line.startswith("| ")]
    assert len(rows) == len(findings) == 8
    for f, row in zip(findings, rows):
        assert row.startswith(f"| {f.number} |") and row.rstrip().endswith(f"| {f.verdict} |")
    assert "Notes:" in text and "no to+ce run" in text  # computed reasons travel with the table


def test_findings_section_tables_the_answered_findings_and_says_what_the_others_need():
    findings = compute_findings(fake_head_evals(), {}, [])  # head evaluations only: no runs, no sweep
    text = findings_section(findings)
    table = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [int(row.split(" | ")[0][2:]) for row in table] == [3, 4, 5, 8]
    for number in (1, 2, 6, 7):  # not comparable: one line each with the reason, no table row
        (f,) = [f for f in findings if f.number == number]
        assert f.verdict == NOT_COMPARABLE and f"- **{number}** {f.claim}: {f.note}" in text
    assert text.index("| 8 |") < text.index("Not answered by these runs")
    none = findings_section([f for f in findings if f.verdict == NOT_COMPARABLE])
    assert "These runs answer none of the paper's findings." in none and "| # |" not in none


# --------------------------------------------------------------------------------------------
# Findings 1 and 2: entropy slopes and their sources
# --------------------------------------------------------------------------------------------


def test_finding1_narrow_entropy_falls_back_to_the_sweep():
    runs = _runs(entropy=(0.30, 0.32))
    f = _by_number(compute_findings(fake_head_evals(), fake_sweep(), runs))
    assert f[1].verdict == REPRODUCED
    assert "decided by temperature sweep" in f[1].note
    assert "RL steps: entropy range was 0.020 nats, below 0.05" in f[1].note
    assert "temperature sweep: -1.20" in f[1].ours and "← decides" in f[1].ours


def test_finding1_falls_back_to_token_level_in_accept_length_units():
    runs = _runs(entropy=(0.30, 0.32), token_stats=True)
    f = _by_number(compute_findings(fake_head_evals(), [], runs))
    assert f[1].verdict == REPRODUCED and "decided by token level" in f[1].note


def test_token_level_slope_is_the_chain_rule_of_expected_accept_length():
    est = token_estimate([_run("to", "ce", _metrics(-1.0), token_stats=_token_stats())], "to")
    # alpha_j(H) = 0.85 - 0.05 j - 0.5 H: the finite difference of 1 + sum_j prod alpha at mean H
    alpha = lambda h: [0.85 - 0.05 * j - 0.5 * h for j in range(1, K + 1)]  # noqa: E731
    h_mean, eps = 0.5, 1e-6
    expected = (expected_accept_length(alpha(h_mean + eps)) - expected_accept_length(alpha(h_mean - eps))) / (2 * eps)
    assert est.comparable and est.slope == pytest.approx(expected, abs=0.02)
    assert est.ci[0] < est.slope < est.ci[1] < 0 and est.r < -0.9


def test_chain_weights_match_the_derivative_of_the_accept_length():
    a = np.array([0.9, 0.7, 0.4])
    eps = 1e-7
    numeric = [(expected_accept_length(a + eps * np.eye(K)[i]) - expected_accept_length(a)) / eps for i in range(K)]
    np.testing.assert_allclose(chain_weights(a), numeric, rtol=1e-5)


def test_finding1_not_reproduced_when_to_does_not_fall_with_entropy():
    f = _by_number(compute_findings(fake_head_evals(), fake_sweep(), _runs(to_slope=0.8)))
    assert f[1].verdict == NOT_REPRODUCED
    assert "does not lie below 0" in f[1].note and "r = +" in f[1].ours


def test_finding1_inconclusive_when_the_interval_contains_zero():
    f = _by_number(compute_findings(fake_head_evals(), fake_sweep(), _runs(to_slope=-0.1, noise=0.1)))
    assert f[1].verdict == INCONCLUSIVE
    assert "contains 0" in f[1].note and "would decide it toward the claim" in f[1].note
    assert "30 RL steps" in f[1].note and "n ∝ (half-width / distance)²" in f[1].note


def test_findings_1_and_2_not_comparable_without_any_source():
    runs = _runs(entropy=(0.30, 0.31))  # too narrow, no sweep, no token stats
    f = _by_number(compute_findings(fake_head_evals(), [], runs))
    assert f[1].verdict == f[2].verdict == NOT_COMPARABLE
    assert "0.010 nats" in f[1].note and "no sweep of the ce head" in f[1].note and "no token stats" in f[1].note


def test_finding2_not_reproduced_gives_the_flattening_percentage():
    f = _by_number(compute_findings(fake_head_evals(), fake_sweep(), _runs(ce_slope=-1.6, tv_slope=-0.5)))
    assert f[2].verdict == NOT_REPRODUCED
    assert "70% flatter" in f[2].ours  # 1 - 0.49 / 1.61
    assert "|TV slope| − 5% |CE slope| +0.41" in f[2].note and "does not lie below 0" in f[2].note


def test_finding2_without_a_ce_decline_is_inconclusive_or_not_reproduced():
    flat = _by_number(compute_findings(fake_head_evals(), fake_sweep(), _runs(ce_slope=0.0, tv_slope=0.0, noise=0.05)))
    assert flat[2].verdict == INCONCLUSIVE and "something to flatten" in flat[2].note
    assert "would decide it" in flat[2].note
    rising = _by_number(compute_findings(fake_head_evals(), fake_sweep(), _runs(ce_slope=0.8, tv_slope=0.0)))
    assert rising[2].verdict == NOT_REPRODUCED and "RS+CE slope" in rising[2].note


def test_finding2_uses_the_sweep_when_rl_entropy_is_flat():
    f = _by_number(compute_findings(fake_head_evals(), fake_sweep(), _runs(entropy=(0.3, 0.33), tv_slope=-0.9)))
    assert f[2].verdict == REPRODUCED and "decided by temperature sweep" in f[2].note
    assert "RL steps: not comparable" in f[2].ours


# --------------------------------------------------------------------------------------------
# Findings 3-5: head evaluations
# --------------------------------------------------------------------------------------------


def test_finding3_order_broken_and_ties_respected():
    offsets = {"ce": (0,) * K, "fkl": (0.1,) * K, "rkl": (2.4,) * K, "tv": (1.3,) * K, "e2e_tv": (3.5,) * K}
    f = _by_number(compute_findings(fake_head_evals(rs_offsets=offsets), [], []))
    assert f[3].verdict == NOT_REPRODUCED
    assert "order e2e_tv > rkl > tv > fkl ≈ ce" in f[3].ours and "tv − rkl = -1.10" in f[3].note
    close = {"ce": (0,) * K, "fkl": (0.1,) * K, "rkl": (1.3,) * K, "tv": (1.6,) * K, "e2e_tv": (3.5,) * K}
    g = _by_number(compute_findings(fake_head_evals(rs_offsets=close), [], []))
    assert g[3].verdict == INCONCLUSIVE and "tv ≈ rkl" in g[3].ours  # a 0.3-point gap cannot be told apart
    assert "tv − rkl = +0.30 points (within ±0.5" in g[3].note


def test_finding3_fkl_versus_ce_holds_by_construction_and_is_not_counted():
    offsets = {"ce": (0,) * K, "fkl": (-1.0,) * K, "rkl": (1.3,) * K, "tv": (2.4,) * K, "e2e_tv": (3.5,) * K}
    f = _by_number(compute_findings(fake_head_evals(rs_offsets=offsets), [], []))
    assert f[3].verdict == REPRODUCED
    assert "|fkl − ce| = 1.00 points holds by construction" in f[3].note and "not counted" in f[3].note


def test_findings_3_to_5_not_comparable_with_missing_losses():
    evals = {k: v for k, v in fake_head_evals().items() if k in ("ce",)}
    f = _by_number(compute_findings(evals, [], []))
    assert f[3].verdict == f[4].verdict == f[5].verdict == NOT_COMPARABLE
    assert "no alpha_RS for e2e_tv, tv, rkl, fkl" in f[3].note
    assert f[3].ours == f[4].ours == f[5].ours == "–"


def test_finding4_gain_that_shrinks_with_depth_is_not_reproduced():
    offsets = {"ce": (0,) * K, "fkl": (0.1,) * K, "rkl": (1.3,) * K, "tv": (2.4,) * K, "e2e_tv": (5.0, 3.5, 2.0)}
    f = _by_number(compute_findings(fake_head_evals(rs_offsets=offsets), [], []))
    assert f[4].verdict == NOT_REPRODUCED and "growth from step 1 to 2 = -1.50 points" in f[4].note
    negative = dict(offsets, e2e_tv=(-3.0, -2.0, -1.0))
    g = _by_number(compute_findings(fake_head_evals(rs_offsets=negative), [], []))
    assert g[4].verdict == NOT_REPRODUCED and "step-3 gain = -1.00 points" in g[4].note
    flat = dict(offsets, e2e_tv=(2.0, 2.2, 2.4))
    h = _by_number(compute_findings(fake_head_evals(rs_offsets=flat), [], []))
    assert h[4].verdict == INCONCLUSIVE and "growth from step 1 to 2 = +0.20 points (within" in h[4].note


def test_finding5_spread_over_the_bound_is_not_reproduced():
    to = {"ce": (0,) * K, "fkl": (0.0,) * K, "rkl": (-0.4,) * K, "tv": (0.6,) * K, "e2e_tv": (0.2,) * K}
    f = _by_number(compute_findings(fake_head_evals(to_offsets=to), [], []))
    assert f[5].verdict == NOT_REPRODUCED and "spread 1.00 points" in f[5].ours and "tv" in f[5].ours


# --------------------------------------------------------------------------------------------
# Findings 6-7: RL runs
# --------------------------------------------------------------------------------------------


def test_finding6_not_comparable_without_an_online_run():
    runs = [r for r in _runs() if r.config["mtp_update"] != "online"]
    f = _by_number(compute_findings({}, [], runs))
    assert f[6].verdict == NOT_COMPARABLE and "online CE" in f[6].note
    assert f[7].verdict == REPRODUCED  # the speed-up does not need the online run


def test_finding6_online_run_that_rises_is_not_reproduced():
    f = _by_number(compute_findings({}, [], _runs(online_drift=+0.4)))
    assert f[6].verdict == NOT_REPRODUCED
    assert "frozen − online-CE accept-length trend" in f[6].note and "does not lie above 0" in f[6].note


def test_finding6_small_decline_in_noise_is_inconclusive():
    """The old rule passed on any decline of the online run; a decline the noise could make is not evidence."""
    f = _by_number(compute_findings({}, [], _runs(online_drift=-0.02, noise=0.05)))
    assert f[6].verdict == INCONCLUSIVE
    assert "contains 0" in f[6].note and "would decide it" in f[6].note
    assert "accept-length trend frozen" in f[6].ours and "frozen − online" in f[6].ours


def test_finding7_slow_rl_step_reports_the_number_and_the_rollout_bound():
    f = _by_number(compute_findings({}, [], _runs(none_step_s=1.2)))
    assert f[7].verdict == NOT_REPRODUCED and "1.20× [1.20, 1.20]" in f[7].ours
    assert "does not lie above 1.5" in f[7].note and "at most 5.00×" in f[7].note  # rollout is 80% of the step
    g = _by_number(compute_findings({}, [], [r for r in _runs() if r.config["mode"] != "none"]))
    assert g[7].verdict == NOT_COMPARABLE and "no none run" in g[7].note


def test_finding7_leaves_out_the_warm_up_step_like_the_step_times():
    """A slow first step (engine start, caches) changes neither the speed-up nor its interval."""
    runs = _runs(none_step_s=1.5)  # rs+e2e_tv steps take 1.0 s: 1.5x, the paper's lower end
    runs[3].metrics[0]["step_s"] = 60.0  # rs+e2e_tv's warm-up step
    f = _by_number(compute_findings({}, [], runs))
    assert "1.50× [1.50, 1.50]" in f[7].ours


def test_runs_loaded_from_directories(tmp_path):
    paths = []
    for i, run in enumerate(_runs()):
        path = tmp_path / f"run{i}"
        path.mkdir()
        (path / "config.json").write_text(json.dumps(run.config))
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.metrics))
        paths.append(path)
    findings = compute_findings(fake_head_evals(), fake_sweep(), [load_run(p) for p in paths])
    assert all(f.verdict == REPRODUCED for f in findings)
    assert not any(isinstance(v, float) and math.isnan(v) for f in findings for v in vars(f).values())


# --------------------------------------------------------------------------------------------
# Finding 8: block verification
# --------------------------------------------------------------------------------------------


def test_finding8_block_gain_survives_shrinks_or_reverses():
    evals = fake_head_evals(block_gains={"ce": 0.02, "e2e_tv": 0.05})
    token_gain = evals["e2e_tv"]["accept_length_rs"] - evals["ce"]["accept_length_rs"]
    sweep = [{**row, "accept_length_block": row["accept_length_rs"] + 0.01} for row in fake_sweep()]
    f = _by_number(compute_findings(evals, sweep, []))[8]
    assert f.verdict == REPRODUCED and "grows (+0.030" in f.note
    assert f"token {token_gain:+.3f}, block {token_gain + 0.03:+.3f}" in f.ours and "T=0.7:" in f.ours
    shrinks = _by_number(compute_findings(fake_head_evals(block_gains={"ce": 0.08, "e2e_tv": 0.01}), [], []))[8]
    assert "shrinks" in shrinks.note
    assert shrinks.verdict == (REPRODUCED if token_gain - 0.07 > 0.005 else NOT_REPRODUCED)
    gone = _by_number(compute_findings(fake_head_evals(block_gains={"ce": token_gain + 0.1, "e2e_tv": 0.0}), [], []))[8]
    assert gone.verdict == NOT_REPRODUCED
    tied = _by_number(compute_findings(fake_head_evals(block_gains={"ce": token_gain, "e2e_tv": 0.001}), [], []))[8]
    assert tied.verdict == INCONCLUSIVE
    wrong = _by_number(compute_findings(fake_head_evals(block_gains={"ce": -0.01}), [], []))[8]
    assert "the evaluation is wrong" in wrong.note


def test_finding8_not_comparable_without_block_lengths():
    evals = fake_head_evals()
    del evals["ce"]["accept_length_block"]
    f = _by_number(compute_findings(evals, [], []))[8]
    assert f.verdict == NOT_COMPARABLE and "accept_length_block" in f.note
