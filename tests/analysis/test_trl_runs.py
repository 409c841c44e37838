"""TRL output directories read as runs: log history rows, per-position keys, the newest checkpoint, bad files."""

from __future__ import annotations

import json

import pytest

from bebop.analysis.runs import load_run, trl_metrics_row
from bebop.utils.errors import BebopError


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


def _trl_dir(path, steps=(1, 2), rollout=None):
    path.mkdir(parents=True, exist_ok=True)
    (path / "trainer_state.json").write_text(json.dumps({"log_history": _history(list(steps))}))
    (path / "bebop_rollout.json").write_text(json.dumps(rollout or {"mode": "rs", "speculate_k": 3,
                                                                    "mtp_loss": "e2e_tv"}))
    return path


def _stats_row(step, **extra):
    return json.dumps({"step": step, "position": [1, 2], "row": [0, 1], "entropy": [0.5, 0.7], "alpha_rs": [0.9, 0.8],
                       "alpha_to": [0.8, 0.6], **extra}) + "\n"


def test_saved_model_config_leaves_a_trl_directory_trl(tmp_path):
    """``trainer.save_model()`` writes the model's config.json into the output directory: still TRL's output."""
    run_dir = _trl_dir(tmp_path / "out")
    (run_dir / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    run = load_run(run_dir)
    assert run.label == "trl:rs+e2e_tv" and [m["step"] for m in run.metrics] == [1, 2]


def test_trl_token_stats_torn_tail_and_repeated_steps_are_left_out_with_a_note(tmp_path, capsys):
    """A torn last line (a run killed while appending) is dropped, as for a `bebop rl` run; rows of steps a
    resumed run logged again are dropped for the later ones; each with a note on stderr."""
    run_dir = _trl_dir(tmp_path / "out", steps=(1, 2, 3))
    rows = [_stats_row(1), _stats_row(2), _stats_row(1, alpha_rs=[0.1, 0.2]), _stats_row(2), _stats_row(2, rollout=2),
            _stats_row(3)]
    (run_dir / "token_stats.jsonl").write_text("".join(rows) + '{"step": 4, "posi')
    run = load_run(run_dir)
    assert [(r["step"], r.get("rollout", 1)) for r in run.token_stats] == [(1, 1), (2, 1), (2, 2), (3, 1)]
    assert run.token_stats[0]["alpha_rs"] == [0.1, 0.2]  # the resumed run's row of step 1
    err = capsys.readouterr().err
    assert "torn last line" in err and "left out 2 row(s) of steps logged again later" in err
    (run_dir / "token_stats.jsonl").write_text(_stats_row(1) + "{torn\n" + _stats_row(2))
    with pytest.raises(BebopError, match="line 2 is not valid JSON"):  # a corrupt line before the last: refused
        load_run(run_dir)


def test_received_rollout_settings_are_checked_and_escaped(tmp_path):
    """Strings of a received bebop_rollout.json reach report.md escaped; a mode or K no run writes is refused."""
    run_dir = _trl_dir(tmp_path / "out", rollout={"mode": "rs", "speculate_k": 3, "mtp_loss": "<img src=x onerror=1>"})
    run = load_run(run_dir)
    assert "<img" not in run.label and "&lt;img" in run.label
    for bad, message in (({"mode": "<b>rs</b>"}, "mode must be one of"), ({"speculate_k": "3; rm"}, "speculate_k")):
        (run_dir / "bebop_rollout.json").write_text(json.dumps({"mode": "rs", "speculate_k": 3, **bad}))
        with pytest.raises(BebopError, match=message):
            load_run(run_dir)


def test_report_of_a_trl_directory_goes_inside_it_by_default_and_escapes_html(tmp_path, capsys):
    """`bebop report RUN` writes RUN/report (a report folder is not an input of its run), `--out RUN/report2` too;
    several runs need --out; a report over, or moving aside, anything else the run holds is refused."""
    from bebop.cli import main

    run_dir = _trl_dir(tmp_path / "out", steps=(1, 2, 3), rollout={"mode": "rs", "speculate_k": 3,
                                                                   "mtp_loss": "<script>x</script>"})
    (run_dir / "token_stats.jsonl").write_text(_stats_row(1) + _stats_row(2) + _stats_row(3))
    assert main(["report", str(run_dir)]) == 0
    text = (run_dir / "report" / "report.md").read_text()
    assert "<script>" not in text and "&lt;script&gt;" in text
    assert main(["report", str(run_dir), "--out", str(run_dir / "report2")]) == 0
    assert load_run(run_dir).metrics == load_run(tmp_path / "out").metrics  # the run still reads as before
    assert main(["report", str(run_dir), str(run_dir)]) == 2
    assert "give --out" in capsys.readouterr().err
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["report", str(run_dir), "--out", str(tmp_path), "--overwrite"]) == 2
    assert "contains the input" in capsys.readouterr().err and sorted(p.name for p in tmp_path.iterdir()) == before
    (run_dir / "checkpoint-2").mkdir()
    (run_dir / "checkpoint-2" / "model.safetensors").write_text("weights")
    assert main(["report", str(run_dir), "--out", str(run_dir / "checkpoint-2"), "--overwrite"]) == 2
    assert "is the input" in capsys.readouterr().err  # --overwrite never moves a part of the run aside
    assert (run_dir / "checkpoint-2" / "model.safetensors").read_text() == "weights"
    assert main(["report", str(run_dir), "--overwrite"]) == 0  # an earlier report is not part of the run


def test_a_trl_directory_without_its_log_history_names_trainer_state_and_save_state(tmp_path, capsys):
    """save_strategy="no" leaves no trainer_state.json: one line naming it and trainer.save_state(), not "run
    config not found" (trainer.save_model() leaves the model's config.json there); nothing is written."""
    from bebop.cli import main

    run_dir = tmp_path / "out"
    run_dir.mkdir()
    (run_dir / "bebop_rollout.json").write_text(json.dumps({"mode": "rs", "speculate_k": 3, "mtp_loss": "e2e_tv"}))
    (run_dir / "token_stats.jsonl").write_text(_stats_row(1))
    (run_dir / "config.json").write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}))
    (tmp_path / "empty").mkdir()
    for where in (run_dir, tmp_path / "empty"):
        assert main(["report", str(where)]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "not found" not in err
        assert "TRL's trainer_state.json" in err and "call trainer.save_state() after trainer.train()" in err
        assert not (where / "report").exists()
    (run_dir / "trainer_state.json").mkdir()
    assert main(["report", str(run_dir)]) == 2
    assert "trainer_state.json is a directory, not a file" in capsys.readouterr().err


def test_a_bebop_run_without_its_metrics_is_still_named_so(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"mode": "rs", "mtp_loss": "e2e_tv"}))
    with pytest.raises(BebopError, match="metrics not found"):
        load_run(run_dir)
