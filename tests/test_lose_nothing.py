"""Lose nothing: validate before touching an output, never truncate a run's history, resume past a
torn log line, tie cache entries to their model, let two processes share a cache, resume with the
run's own settings, and keep an empty --stop.

Each section pins one of these, named in its header.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bebop import embedded
from bebop.cli import main
from bebop.mtp.data import Sequences
from bebop.mtp.train import TrainMtpConfig, train_mtp
from bebop.rl import train_rl
from bebop.speculative import SamplingParams, generate
from bebop.utils.errors import BebopError
from bebop.utils.files import atomic_dir, read_jsonl
from bebop.utils.outputs import check_output_dir, check_output_file, prepare_output_dir
from bebop.utils.torch_utils import state_sha256
from tests.helpers.cli import error_line
from tests.helpers.models import tiny_model
from tests.helpers.rl import tiny_config, tiny_policy

RL_FLAGS = ["--mode", "rs", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "6",
            "--save-every", "1"]


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` by relative path, with its bytes."""
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def _sequences(num: int = 16, vocab: int = 64) -> Sequences:
    g = torch.Generator().manual_seed(0)
    return Sequences([torch.randint(1, vocab, (12,), generator=g).tolist() for _ in range(num)], [3] * num)


# ------------------------------------------------------------------------------------------------- --out


def test_output_dir_rules(tmp_path):
    check_output_dir(tmp_path / "new")  # missing: fine
    (tmp_path / "empty").mkdir()
    check_output_dir(tmp_path / "empty")  # empty: fine
    full = tmp_path / "full"
    full.mkdir()
    (full / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(BebopError, match="not empty; give --resume .* or --overwrite"):
        check_output_dir(full, resume=False)
    with pytest.raises(BebopError, match="not empty; give --overwrite") as err:  # a command without --resume
        check_output_dir(full)
    assert "--resume" not in str(err.value)
    check_output_dir(full, resume=True)
    with pytest.raises(BebopError, match="exclude each other"):
        check_output_dir(full, resume=True, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(BebopError, match="is a file"):
        check_output_dir(tmp_path / "file", overwrite=True)
    with pytest.raises(BebopError, match="not a directory"):
        check_output_dir(tmp_path / "file" / "sub")
    lines = []
    old = prepare_output_dir(full, overwrite=True, announce=lines.append)
    assert old.parent == tmp_path and old.name.startswith("full.old-")
    assert (old / "metrics.jsonl").read_text() == "{}\n" and full.is_dir() and not any(full.iterdir())
    assert lines == [f"bebop: moved the existing {full} aside to {old}"]
    (full / "again").write_text("y")
    second = prepare_output_dir(full, overwrite=True, announce=lines.append)
    assert second != old and (second / "again").is_file() and (old / "metrics.jsonl").is_file()


def test_rl_bad_flag_on_an_existing_run_changes_nothing(use_cache, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["rl", "--out", str(run), "--steps", "1", *RL_FLAGS]) == 0
    before = snapshot(run)
    for argv, message in ((["--out", str(run), "--steps", "2", "--top-p", "1.5", *RL_FLAGS], "top_p"),
                          (["--resume", str(run), "--steps", "2", "--top-k", "-1"], "top_k"),
                          (["--out", str(run), "--steps", "2", *RL_FLAGS], "not empty"),
                          (["--resume", str(run), "--overwrite"], "exclude each other")):
        assert main(["rl", *argv]) == 2
        assert message in error_line(capsys)
        assert snapshot(run) == before, f"rl {' '.join(argv)} changed the run"


def test_rl_overwrite_moves_the_old_run_aside(use_cache, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["rl", "--out", str(run), "--steps", "1", "--seed", "1", *RL_FLAGS]) == 0
    before = snapshot(run)
    assert main(["rl", "--out", str(run), "--steps", "1", "--overwrite", *RL_FLAGS]) == 0
    (old,) = tmp_path.glob("run.old-*")
    assert snapshot(old) == before
    assert f"moved the existing {run} aside to {old}" in capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["seed"] == 0


def test_library_runs_refuse_a_non_empty_directory(tmp_path):
    model, tok = tiny_policy()
    run = tmp_path / "run"
    train_rl(model, tok, None, tiny_config(mode="none", steps=1), run, show_progress=False)
    before = snapshot(run)
    with pytest.raises(BebopError, match="not empty"):
        train_rl(model, tok, None, tiny_config(mode="none", steps=2), run, show_progress=False)
    assert snapshot(run) == before
    head_dir = tmp_path / "head"
    cfg = TrainMtpConfig(loss="ce", steps=1, batch_size=2, speculate_k=2)
    backbone = tiny_model()
    train_mtp(backbone, _sequences(), head_dir, cfg, show_progress=False)
    before = snapshot(head_dir)
    with pytest.raises(BebopError, match="not empty"):
        train_mtp(backbone, _sequences(), head_dir, cfg, show_progress=False)
    assert snapshot(head_dir) == before


def test_train_mtp_out_is_refused_then_moved_aside(use_cache, tmp_path, capsys):
    head = tmp_path / "head"
    args = ["train-mtp", "--steps", "1", "--batch-size", "2", "--out", str(head)]
    assert main(args) == 0
    before = snapshot(head)
    assert main(args) == 2
    assert "not empty" in error_line(capsys)
    assert snapshot(head) == before
    assert main([*args, "--overwrite"]) == 0
    (old,) = tmp_path.glob("head.old-*")
    assert snapshot(old) == before and (head / "mtp_config.json").is_file()


def test_report_out_is_refused_unless_overwrite(use_cache, tmp_path, capsys):
    run, out = tmp_path / "run", tmp_path / "report"
    assert main(["rl", "--out", str(run), "--steps", "1", *RL_FLAGS]) == 0
    out.mkdir()
    (out / "notes.md").write_text("mine")
    assert main(["report", str(run), "--out", str(out)]) == 2
    assert (out / "notes.md").read_text() == "mine" and not (out / "report.md").exists()
    assert main(["report", str(run), "--out", str(out), "--overwrite"]) == 0
    (old,) = tmp_path.glob("report.old-*")
    assert (old / "notes.md").read_text() == "mine" and (out / "report.md").is_file()


def test_demo_overwrite_starts_afresh(tmp_path, monkeypatch, capsys):
    import bebop.demo

    seen = []
    monkeypatch.setattr(bebop.demo, "run_demo", lambda cfg: seen.append(sorted(os.listdir(cfg.out))) or "r.md")
    out = tmp_path / "demo"
    out.mkdir()
    (out / "report.md").write_text("old")
    assert main(["demo", "--quick", "--out", str(out)]) == 0  # an existing demo directory is continued
    assert main(["demo", "--quick", "--out", str(out), "--overwrite"]) == 0
    assert seen == [["report.md"], []]
    (old,) = tmp_path.glob("demo.old-*")
    assert (old / "report.md").read_text() == "old"


# ------------------------------------------------------------------------------------------------- up front


def _must_not_run(*args, **kwargs):
    raise AssertionError("the computation ran before its inputs were checked")


def test_generate_and_eval_paths_are_checked_first(use_cache, tmp_path, monkeypatch, capsys):
    import bebop.mtp.evaluate
    import bebop.speculative

    monkeypatch.setattr(bebop.speculative, "generate", _must_not_run)
    monkeypatch.setattr(bebop.mtp.evaluate, "evaluate_mtp", _must_not_run)
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("x")
    assert main(["generate", "--mode", "none", "--out", str(tmp_path / "dir")]) == 2
    assert "is a directory" in error_line(capsys)
    assert main(["generate", "--mode", "none", "--out", str(tmp_path / "o.jsonl"),
                 "--stats-json", str(tmp_path / "file" / "stats.json")]) == 2
    assert "not a directory" in error_line(capsys)
    assert main(["eval-mtp", "--num-sequences", "4", "--json", str(tmp_path / "dir")]) == 2
    assert "is a directory" in error_line(capsys)
    with pytest.raises(BebopError):
        check_output_file(tmp_path / "dir")


def test_pretrain_rejects_no_steps_or_no_eval_and_keeps_the_cache(use_cache, tmp_path, capsys):
    model_dir = embedded.embedded_model_dir()
    before = snapshot(model_dir)
    for flags, name in ((["--steps", "0"], "steps"), (["--steps", "-3"], "steps"),
                        (["--eval-problems", "0", "--steps", "1"], "eval_problems")):
        assert main(["pretrain", *flags, "--overwrite"]) == 2
        assert f"{name} must be an integer in [1, 2**63 - 1], got {flags[1]}" in error_line(capsys)
    assert main(["pretrain", "--steps", "1", "--eval-problems", "0", "--out", str(tmp_path / "m")]) == 2
    assert not (tmp_path / "m").exists()
    assert main(["pretrain", "--steps", "1", "--eval-problems", "1"]) == 2
    assert "not empty" in error_line(capsys)
    assert snapshot(model_dir) == before


def _prompt_file(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("bad_row, message", [
    ({"prompt": "", "answer": "7"}, r":7: empty prompt"),
    ({"prompt": "Q " + " + ".join(["1"] * 150) + " = ?", "answer": "150"}, r":7: prompt too long"),
    ({"prompt": "Q 1 + 1 = ?"}, r":7: the reward needs field\(s\) \['answer'\]"),
], ids=["empty", "too-long", "no-answer"])
def test_every_rl_row_is_checked_before_the_run(tmp_path, bad_row, message):
    rows = [{"prompt": f"Q {i} + 1 = ?", "answer": str(i + 1)} for i in range(8)]
    rows[6] = bad_row
    data = _prompt_file(tmp_path / "prompts.jsonl", rows)
    model, tok = tiny_policy()
    cfg = tiny_config(mode="none", task="math", data=data, reward="math", steps=4)
    with pytest.raises(BebopError, match=message):
        train_rl(model, tok, None, cfg, tmp_path / "run", show_progress=False)
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------------------------- torn lines


def test_read_jsonl_drops_only_a_torn_last_line(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x": [1, 2')
    assert read_jsonl(path, torn_tail_ok=True) == [{"step": 1}, {"step": 2}]
    with pytest.raises(BebopError, match="line 3 is not valid JSON"):
        read_jsonl(path)
    path.write_text('{"step": 1}\n{"step": 2, "x\n{"step": 3}\n')
    with pytest.raises(BebopError, match="line 2 is not valid JSON"):
        read_jsonl(path, torn_tail_ok=True)


def test_train_mtp_resumes_past_a_torn_last_line(tmp_path):
    backbone, out = tiny_model(), tmp_path / "head"
    cfg = TrainMtpConfig(loss="ce", steps=2, batch_size=2, speculate_k=2, save_every=1)
    train_mtp(backbone, _sequences(), out, cfg, show_progress=False)
    with (out / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "loss": 0.5, "alpha_')  # killed while appending step 3
    train_mtp(backbone, _sequences(), out, replace(cfg, steps=4), resume=True,
              show_progress=False)
    assert [r["step"] for r in read_jsonl(out / "metrics.jsonl")] == [1, 2, 3, 4]


# ------------------------------------------------------------------------------------------------- model hash


def _perturb(model) -> None:
    with torch.no_grad():
        next(model.parameters()).add_(0.5)


def test_self_generated_data_follows_the_model(tmp_path):
    model, tok = tiny_policy()
    first = embedded.embedded_data("eval", model, tok, num=3, path=tmp_path / "data.jsonl")
    assert embedded.embedded_data("eval", model, tok, num=3, path=tmp_path / "data.jsonl").token_ids == \
        first.token_ids
    _perturb(model)
    embedded.embedded_data("eval", model, tok, num=3, path=tmp_path / "data.jsonl")
    files = sorted(p.name for p in tmp_path.glob("data-*.jsonl"))
    assert len(files) == 2, "a changed model gets its own data; the old file stays"
    assert f"data-{state_sha256(model)[:16]}.jsonl" in files


def test_cached_heads_are_rebuilt_when_the_model_changes(tmp_path, monkeypatch):
    import bebop.mtp.train

    calls = []
    real = bebop.mtp.train.train_mtp
    monkeypatch.setattr(bebop.mtp.train, "train_mtp", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    model, tok = tiny_policy()
    data = _sequences(vocab=len(tok))
    kwargs = dict(root=tmp_path, warmup_steps=1, steps=1, data=data, show_progress=False)
    path = embedded.ensure_embedded_head("tv", model, tok, **kwargs)
    assert len(calls) == 2  # warm-start head, then the tv head
    assert embedded.ensure_embedded_head("tv", model, tok, **kwargs) == path and len(calls) == 2
    _perturb(model)
    embedded.ensure_embedded_head("tv", model, tok, **kwargs)
    assert len(calls) == 4, "both heads were trained on the old weights and must be rebuilt"
    saved = json.loads((path / "mtp_config.json").read_text())
    assert saved["model_sha256"] == state_sha256(model)


# ------------------------------------------------------------------------------------------------- concurrency


def _swap_many(final: str, tag: str, barrier, errors) -> None:
    barrier.wait()
    try:
        for i in range(200):
            with atomic_dir(final) as tmp:
                (tmp / "a.txt").write_text(f"{tag}{i}")
                (tmp / "b.txt").write_text(f"{tag}{i}")
    except Exception as e:  # noqa: BLE001 - reported to the parent
        errors.put(repr(e))


def test_two_writers_of_one_directory(tmp_path):
    """200 swaps by each of two processes: the unlocked swap failed ("Directory not empty") in 4 of 4 trials."""
    ctx = multiprocessing.get_context("fork")
    barrier, errors = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_swap_many, args=(str(tmp_path / "entry"), t, barrier, errors)) for t in "AB"]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0] and errors.empty()
    assert sorted(os.listdir(tmp_path)) == ["entry"], "no .old- or .tmp- leftovers"
    a, b = ((tmp_path / "entry" / n).read_text() for n in ("a.txt", "b.txt"))
    assert a == b and a in ("A199", "B199")


def _fake_pretrain(out_dir, cfg=None, show_progress=True) -> None:
    Path(out_dir).parent.mkdir(parents=True, exist_ok=True)
    with open(Path(out_dir).parent / "builds.log", "a") as f:
        f.write(f"{os.getpid()}\n")
    time.sleep(0.5)
    with atomic_dir(out_dir) as tmp:
        (tmp / "config.json").write_text("{}")


def _first_use(barrier) -> None:
    barrier.wait()
    embedded.ensure_embedded_model(show_progress=False)


def test_two_processes_build_the_cached_model_once(tmp_path, monkeypatch):
    monkeypatch.setattr(embedded, "pretrain", _fake_pretrain)
    ctx = multiprocessing.get_context("fork")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_first_use, args=(barrier,)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    root = embedded.embedded_model_dir().parent
    assert len((root / "builds.log").read_text().split()) == 1, "the second process waited and reused the entry"
    assert sorted(os.listdir(root)) == [".model.lock", "builds.log", "model"]


# ------------------------------------------------------------------------------------------------- resume settings


def test_train_mtp_resume_applies_steps_and_refuses_the_rest(tmp_path):
    backbone, out = tiny_model(), tmp_path / "head"
    cfg = TrainMtpConfig(loss="ce", steps=2, batch_size=2, speculate_k=2, save_every=1)
    train_mtp(backbone, _sequences(), out, cfg, show_progress=False)
    before = snapshot(out)
    for change, message in (({"lr": 2e-3}, r"lr 0.001 -> 0.002"), ({"batch_size": 4}, r"batch_size 2 -> 4"),
                            ({"steps": 1}, r"steps=1: its checkpoint is at step 2")):
        with pytest.raises(BebopError, match=message):
            train_mtp(backbone, _sequences(), out, replace(cfg, **change), resume=True,
                      show_progress=False)
    with pytest.raises(BebopError, match="trained on another model"):
        train_mtp(tiny_model(seed=1), _sequences(), out, cfg, resume=True, show_progress=False)
    assert snapshot(out) == before
    train_mtp(backbone, _sequences(), out, replace(cfg, steps=3), resume=True,
              show_progress=False)
    saved = json.loads((out / "mtp_config.json").read_text())
    assert saved["train"]["steps"] == 3
    assert saved["resumes"] == [{"at_step": 2, "changed": {"steps": [2, 3]}}]


def test_cli_resume_keeps_the_checkpoint_settings(use_cache, tmp_path, capsys):
    out = tmp_path / "head"
    assert main(["train-mtp", "--loss", "rkl", "--steps", "1", "--batch-size", "2", "--lr", "0.002",
                 "--out", str(out)]) == 0
    assert main(["train-mtp", "--resume", "--steps", "2", "--out", str(out)]) == 0
    assert json.loads((out / "mtp_config.json").read_text())["train"]["batch_size"] == 2
    assert main(["train-mtp", "--resume", "--steps", "3", "--lr", "0.5", "--out", str(out)]) == 2
    assert "lr 0.002 -> 0.5" in error_line(capsys)


# ------------------------------------------------------------------------------------------------- --stop ""


def test_empty_stop_string_is_an_error(use_cache, tmp_path, monkeypatch, capsys):
    import bebop.speculative

    monkeypatch.setattr(bebop.speculative, "generate", _must_not_run)
    assert main(["generate", "--mode", "none", "--stop", "", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "stop strings must be non-empty" in error_line(capsys)
    model, tok = tiny_policy()
    with pytest.raises(BebopError, match="stop strings must be non-empty"):
        generate(model, tok, ["Q 1 + 1 = ?"], sampling=SamplingParams(stop=("A", "")))
