"""Tests for bebop.analysis.report and .plots on synthetic run directories."""

import json
import math
import re

import numpy as np
import pytest

from bebop.analysis import plots
from bebop.analysis.report import write_report
from bebop.analysis.runs import load_run, run_label
from bebop.analysis.answer import entropy_series
from bebop.analysis.summary import step_speedup, summarize_run
from bebop.utils.errors import BebopError
from tests.helpers.analysis import NUM_STEPS, PNG_MAGIC, K, fake_metrics

def _write_run(path, config, metrics, token_stats=None):
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    if token_stats is not None:
        (path / "token_stats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in token_stats))
    return path


def _token_stats(seed):
    rng = np.random.default_rng(seed)
    rows = []
    for s in range(5):
        entropy = rng.exponential(0.4, 90)
        alpha_rs = np.clip(0.95 - 0.05 * entropy + rng.normal(0, 0.02, 90), 0, 1)
        alpha_to = np.clip(0.95 - 0.4 * entropy, 0, 1)
        rows.append({"step": s, "position": [1, 2, 3] * 30, "row": [i // 3 for i in range(90)],
                     "entropy": entropy.tolist(),
                     "alpha_rs": alpha_rs.tolist(), "alpha_to": alpha_to.tolist()})
    return rows


def _config(mode, mtp_loss=None, label=None, **extra):
    cfg = {"mode": mode, "mtp_loss": mtp_loss, "mtp_update": "frozen", "online_loss": None, "speculate_k": K}
    if label:
        cfg["label"] = label
    return {**cfg, **extra}


@pytest.fixture
def runs(tmp_path):
    return [
        _write_run(tmp_path / "none", _config("none", label="none"), fake_metrics("none", 0, 0, 2.0, 0)),
        _write_run(tmp_path / "to_ce", _config("to", "ce"), fake_metrics("to", -1.5, 3.0 + 0.6, 1.4, 1)),
        _write_run(
            tmp_path / "rs_tv",
            _config("rs", "e2e_tv", label="rs+e2e_tv"),
            fake_metrics("rs", -0.06, 3.6, 1.2, 2),
            _token_stats(3),
        ),
    ]


def test_load_run_builds_label_and_sorts_steps(tmp_path, runs):
    run = load_run(runs[1])
    assert run.label == "to+ce" and run.path == runs[1]
    assert [m["step"] for m in run.metrics] == list(range(NUM_STEPS))
    assert run.token_stats is None and load_run(runs[2]).token_stats is not None
    cfg = _config("rs", "tv", mtp_update="online", online_loss="e2e_tv")
    assert run_label(cfg) == "rs+tv+online-e2e_tv"


def test_summary_recovers_entropy_slope_within_ci(runs):
    for run_dir, slope in [(runs[1], -1.5), (runs[2], -0.06)]:
        s = summarize_run(load_run(run_dir))
        lo, hi = s["entropy_slope"].ci
        assert lo <= slope <= hi, (s["label"], s["entropy_slope"])
        assert s["entropy_slope"].n == NUM_STEPS and s["entropy_slope"].unit == "RL steps"
    s = summarize_run(load_run(runs[1]))
    assert s["step_s"] == pytest.approx(1.4) and s["rollout_s"] == pytest.approx(0.98)
    assert s["accept_length_start"] > s["accept_length_end"]  # entropy rises, TO-CE acceptance falls
    assert s["final_accuracy"] == pytest.approx(0.3 + 0.01 * np.mean(range(32, 40)))
    assert s["accuracy_start"] == pytest.approx(0.3 + 0.01 * np.mean(range(0, 8)))
    # Entropy rises from about 0.25 to 0.55 over the run: start/end are window means, the change has an interval.
    assert s["entropy_start"] == pytest.approx(0.25 + 0.3 * 3.5 / 39, abs=0.01)
    assert s["entropy_end"] - s["entropy_start"] == pytest.approx(s["entropy_change"].estimate)
    lo, hi = s["entropy_change"].ci
    assert 0.2 < lo <= s["entropy_change"].estimate <= hi < 0.3
    assert len(s["alpha_rs_start"]) == K and len(s["accepted_per_pos_end"]) == K
    assert abs(s["mismatch_part_end"]) < 0.1  # the synthetic drop is all entropy


def test_summary_of_none_run_has_nan_spec_values(runs):
    s = summarize_run(load_run(runs[0]))
    assert math.isnan(s["accept_length_start"]) and math.isnan(s["entropy_slope"].estimate)
    assert math.isfinite(s["entropy_change"].estimate)  # every run reports its entropy change
    assert s["alpha_rs_end"] == [] and s["token"] is None


def test_token_summary(runs):
    t = summarize_run(load_run(runs[2]))["token"]
    assert t["num_positions"] == 450
    assert t["share_rs_wins"] + t["share_to_wins"] + t["share_tie"] == pytest.approx(1.0)
    assert t["share_rs_wins"] > 0.5
    assert t["alpha_to_slope"].estimate == pytest.approx(-0.4, abs=0.05)
    assert t["alpha_rs_slope"].unit == "sequences" and t["alpha_rs_slope"].n == 5 * 30  # 30 completions per step


def test_write_report_mentions_every_run_and_writes_plots(tmp_path, runs):
    evals = [
        {"loss": loss, "temperature": tau, "alpha_rs": [0.8, 0.7, 0.6], "alpha_to": [0.75, 0.6, 0.5],
         "accept_length_rs": 2.5 - 0.1 * tau, "accept_length_to": 2.3 - 0.5 * tau, "target_entropy": 0.4 * tau,
         "num_positions": 300}
        for loss in ("ce", "e2e_tv") for tau in (0.5, 1.0)
    ]
    out = tmp_path / "report"
    path = write_report(runs, out, title="Synthetic", extra_sections=["## Notes\n\nhand-written"], head_evals=evals)
    text = path.read_text()
    assert path == out / "report.md" and text.startswith("# Synthetic")
    for label in ("none", "to+ce", "rs+e2e_tv"):
        assert f"| {label} |" in text
    assert "hand-written" in text and "Skipped" not in text
    assert "1.00×" in text and f"{2.0 / 1.2:.2f}×" in text  # speed-up over the none run
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(links) == 5 and links[0] == "accept_vs_entropy.png"  # one figure per question
    for link in links:
        png = out / link
        assert png.read_bytes().startswith(PNG_MAGIC) and png.stat().st_size > 1000
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporary files left


def test_write_report_skips_plots_without_data(tmp_path, runs):
    text = write_report([runs[0]], tmp_path / "out").read_text()
    assert "| none |" in text
    assert text.count("_Skipped:") == 4  # per-position, mismatch, token, head evals
    assert "No run used MTP" in text  # the answer says why it has no figure
    assert (tmp_path / "out" / "step_latency.png").exists()
    assert not (tmp_path / "out" / "accept_vs_entropy.png").exists()
    assert "No `none` run" not in text


def test_write_report_disambiguates_duplicate_labels(tmp_path, runs):
    config = _config("rs", "e2e_tv", label="rs+e2e_tv")
    copy = _write_run(tmp_path / "rs_tv_2", config, fake_metrics("rs", 0, 3.5, 1.0, 4))
    text = write_report([runs[2], copy], tmp_path / "out").read_text()
    assert "rs+e2e_tv (rs_tv)" in text and "rs+e2e_tv (rs_tv_2)" in text
    assert "No `none` run" in text


def test_a_torn_last_line_is_left_out_with_a_note_as_resume_does(tmp_path, runs, capsys):
    """A run killed while appending its last row reports like the run --resume continues."""
    metrics = runs[1] / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 40, "mode": \n')
    run = load_run(runs[1])
    assert len(run.metrics) == NUM_STEPS
    assert f"{metrics}: left out its torn last line" in capsys.readouterr().err


def test_a_corrupt_line_before_the_last_gives_one_line_error(tmp_path, runs):
    metrics = runs[1] / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join([*lines[:5], '{"step": 5, "mode": ', *lines[5:]]) + "\n")
    with pytest.raises(BebopError) as err:
        load_run(runs[1])
    message = str(err.value)
    assert "\n" not in message and str(metrics) in message and "line 6" in message


def test_report_of_a_bad_run_leaves_no_out_directory_nor_suggests_resume(tmp_path, runs, capsys):
    """The runs are read before --out is made; report has no --resume to suggest."""
    from bebop.cli import main

    (runs[1] / "metrics.jsonl").write_text("")
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "report")]) == 2
    assert "no steps" in capsys.readouterr().err and not (tmp_path / "report").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(["report", str(runs[0]), "--out", str(tmp_path / "full")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "is not empty; give --overwrite to move it aside" in line and "--resume" not in line


@pytest.mark.parametrize(
    ("name", "content", "needle"),
    [
        ("config.json", None, "not found"),
        ("config.json", "[1, 2]", "not a JSON object"),
        ("metrics.jsonl", "", "no steps"),
        ("metrics.jsonl", '{"mode": "rs"}\n', "no integer 'step'"),
        ("token_stats.jsonl", '{"step": 0, "position": [1], "entropy": [0.1, 0.2], "alpha_rs": [1], "alpha_to": [1]}\n',
         "different lengths"),
    ],
)
def test_bad_files_give_clear_errors(runs, name, content, needle):
    path = runs[2] / name
    if content is None:
        path.unlink()
    else:
        path.write_text(content)
    with pytest.raises(BebopError, match=needle) as err:
        load_run(runs[2])
    assert name in str(err.value) and "\n" not in str(err.value)


def test_write_report_needs_runs(tmp_path):
    with pytest.raises(BebopError):
        write_report([], tmp_path)
    with pytest.raises(BebopError, match="not found"):
        write_report([tmp_path / "missing"], tmp_path / "out")


def test_report_leads_with_the_answer(tmp_path, runs):
    """First screen: step time with and without MTP, their ratio with its interval, the rollout's share and
    accept length against entropy with its one figure; then the findings the runs answer; then details."""
    text = write_report(runs, tmp_path / "out").read_text()
    answer, findings = text.index("## The answer"), text.index("## The paper's findings")
    details = text.index("## Details")
    assert answer < text.index("![Accept length vs entropy](accept_vs_entropy.png)") < findings < details
    first = text[answer:].split("\n\n")[1]  # the answer's paragraph
    ratio, _, _ = step_speedup([load_run(runs[0])], [load_run(runs[2])])
    assert ratio.estimate == pytest.approx(2.0 / 1.2) and ratio.ci[0] <= ratio.estimate <= ratio.ci[1]
    assert (f"**An RL step took 1.2 s with MTP (rs+e2e_tv) and 2 s without (none): a speed-up of "
            f"{ratio.estimate:.2f}× [{ratio.ci[0]:.2f}, {ratio.ci[1]:.2f}]**") in first  # the paper's recipe
    assert "the rollout was 70% of the step without MTP (so a faster rollout gives at most 3.33× a step)" in first
    assert f"over {2 * (NUM_STEPS - 1)} RL steps, each run's first step left out" in first
    assert "Accept length was 3.58 tokens per verify pass" in first and "slope -0.0" in first
    assert "every run's speed-up" in first  # a second speculative role (to+ce) is in the runs table
    assert (tmp_path / "out" / "accept_vs_entropy.png").read_bytes().startswith(PNG_MAGIC)
    assert not (tmp_path / "out" / "headline.png").exists()
    # Findings: only those the runs answer are in the table; the others say what they need.
    section = text[findings:details]
    rows = [line for line in section.splitlines() if re.match(r"\| \d \|", line)]
    assert [row.split(" | ")[0] for row in rows] == ["| 1", "| 7"] and "| not comparable |" not in section
    assert "- **3** RS acceptance by loss" in section and "no alpha_RS for" in section
    assert "entropy start → end" in text and "accuracy start → end" in text


def test_answer_without_a_baseline_says_how_to_get_one(tmp_path, runs):
    text = write_report([runs[2]], tmp_path / "out").read_text()
    answer = text[text.index("## The answer"):text.index("## The paper's findings")]
    assert "An RL step took 1.2 s with MTP (rs+e2e_tv); no run without MTP was given" in answer
    assert "run the baseline with `--mode none`" in answer and "speed-up of" not in answer


def test_answer_pools_the_seeds_of_the_papers_recipe(tmp_path, runs):
    seed = _write_run(tmp_path / "rs_tv_seed1", _config("rs", "e2e_tv", label="rs+e2e_tv-seed1"),
                      fake_metrics("rs", -0.06, 3.6, 1.2, 7))
    text = write_report([runs[0], runs[1], runs[2], seed], tmp_path / "out").read_text()
    assert "with MTP (rs+e2e_tv, 2 runs pooled) and 2 s without (none)" in text
    ratio, _, _ = step_speedup([load_run(runs[0])], [load_run(runs[2]), load_run(seed)])
    assert ratio.n == 3 * (NUM_STEPS - 1)
    assert f"over {ratio.n} RL steps" in text


def test_runs_table_gives_the_speed_up_interval_and_no_slope_from_too_few_steps(tmp_path, runs):
    short = _write_run(tmp_path / "short", _config("rs", "ce"), fake_metrics("rs", -1.0, 3.6, 1.0, 5)[:2])
    text = write_report([runs[0], runs[2], short], tmp_path / "out").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| rs+ce |"))
    assert "| 2.00× (no interval) |" in row and row.endswith("| – |")  # 1 timed step; 2 steps fit no slope
    assert "| 1.00× (the baseline) |" in text


def test_accept_vs_entropy_series_has_every_speculative_role_with_its_band(runs):
    series = entropy_series([load_run(r) for r in runs])
    assert list(series) == ["to+ce", "rs+e2e_tv"]  # every speculative role, in the order given
    to = series["to+ce"]
    assert len(to.entropy) == NUM_STEPS and "slope -1.49 [" in to.legend and "(40 steps, 1 run)" in to.legend
    low, high = to.band
    assert (np.asarray(low) < np.asarray(to.line)).all() and (np.asarray(to.line) < np.asarray(high)).all()


def test_step_latency_of_a_trl_run_splits_its_step_into_rollout_and_rest(tmp_path):
    """A TRL run logs its rollout seconds and TRL's step time only: the bar is the step, not the rollout."""
    state = {"log_history": [{"step": s, "loss": 0.1, "step_time": 2.0, "spec/rollout_seconds": 1.5,
                              "spec/accept_length": 2.5, "entropy": 0.3 + 0.01 * s} for s in range(1, 6)]}
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "trainer_state.json").write_text(json.dumps(state))
    (tmp_path / "trl" / "bebop_rollout.json").write_text(json.dumps({"mode": "rs", "mtp_loss": "e2e_tv"}))
    s = summarize_run(load_run(tmp_path / "trl"))
    np.testing.assert_allclose(plots.latency_parts(s["rollout_s"], s["train_s"], s["mtp_s"], s["step_s"]),
                               [1.5, 0, 0, 0.5])
    text = write_report([tmp_path / "trl"], tmp_path / "out").read_text()
    assert "### Mean time per RL step, by part (Fig. 7)" in text and "TRL's `step_time`" in text


def test_step_times_leave_out_the_warm_up_step(tmp_path):
    metrics = fake_metrics("none", 0.0, 1.0, 1.0, seed=0)
    metrics[0].update(step_s=30.0, rollout_s=29.0)  # the first step's one-time costs
    s = summarize_run(load_run(_write_run(tmp_path / "run", {"mode": "none"}, metrics)))
    assert s["step_s"] == pytest.approx(1.0) and s["rollout_s"] == pytest.approx(0.7)


def test_report_command_takes_eval_mtp_json(tmp_path, runs):
    from bebop.cli import main

    evals = []
    for loss, alpha in (("ce", 0.6), ("e2e_tv", 0.7)):
        path = tmp_path / f"{loss}.json"
        path.write_text(json.dumps({"loss": loss, "temperature": 1.0, "alpha_rs": [alpha] * K, "alpha_to": [alpha] * K,
                                    "accept_length_rs": 2.0, "accept_length_to": 1.9, "target_entropy": 0.5,
                                    "num_positions": 100}))
        evals += ["--eval", str(path)]
    assert main(["report", *map(str, runs), "--out", str(tmp_path / "report"), *evals]) == 0
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## MTP head evaluations")[1]
    assert "Skipped: no head evaluations" not in section and "| e2e_tv |" in section and "| ce |" in section


def test_accuracy_change_has_an_interval_that_sees_a_real_rise(tmp_path):
    """A run whose accuracy climbs 0.2 -> 0.4 gets an interval above 0; a flat one an interval around 0."""
    rng = np.random.default_rng(0)
    for name, rise in (("up", 0.2), ("flat", 0.0)):
        metrics = fake_metrics("none", 0.0, 1.0, 1.0, seed=0)
        n = len(metrics)
        for i, row in enumerate(metrics):
            row["accuracy"] = float(np.clip(0.2 + rise * i / (n - 1) + rng.normal(0, 0.03), 0, 1))
        s = summarize_run(load_run(_write_run(tmp_path / name, {"mode": "none"}, metrics)))
        low, high = s["accuracy_change"].ci
        assert (low > 0) if rise else (low < 0 < high), (name, low, high)
