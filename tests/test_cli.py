"""The ``bebop`` command end to end on a tiny budget: the embedded default path, and clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bebop.cli import main
from tests.helpers.cli import error_line


def test_embedded_model_and_head_are_cached(use_cache):
    root = next(use_cache.glob("embedded-*"))
    assert (root / "model" / "config.json").is_file()
    assert (root / "model" / "tokenizer.json").is_file()
    assert (root / "heads" / "e2e_tv" / "model.safetensors").is_file()
    assert (root / "heads" / "e2e_tv" / "metrics.jsonl").is_file()


def test_eval_mtp_json(use_cache, tmp_path, capsys):
    out = tmp_path / "eval.json"
    assert main(["eval-mtp", "--num-sequences", "4", "--speculate-k", "3", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    for key in ("alpha_rs", "alpha_to", "accept_length_rs", "accept_length_to", "target_entropy", "num_positions"):
        assert key in result
    assert len(result["alpha_rs"]) == 3 and 1.0 <= result["accept_length_rs"] <= 4.0
    printed = capsys.readouterr().out.splitlines()
    assert "alpha_RS per step" in printed[0] and printed[0].endswith("| rows |")
    # The rows evaluated and the accept lengths' 95% intervals over rows are printed and saved.
    assert result["num_rows"] == 4 and result["accept_length_rs_ci95"] > 0 and result["accept_length_to_ci95"] > 0
    assert f"{result['accept_length_rs']:.3f} ± {result['accept_length_rs_ci95']:.3f}" in printed[2]
    assert printed[2].endswith("| 4 |")
    assert result["chain_context"] == "served"  # the default: what the engine drafts from
    assert main(["eval-mtp", "--num-sequences", "4", "--chain-context", "unrolled", "--json", str(out)]) == 0
    unrolled = json.loads(out.read_text())
    assert unrolled["chain_context"] == "unrolled" and unrolled["alpha_rs"][0] == pytest.approx(result["alpha_rs"][0])


@pytest.mark.parametrize("mode", ["none", "to", "rs"])
def test_generate(use_cache, tmp_path, mode, capsys):
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    argv = ["generate", "--mode", mode, "--num-prompts", "3", "--max-new-tokens", "6", "--out", str(out),
            "--stats-json", str(stats), "--seed", "1"]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all({"prompt", "completion", "token_ids"} <= set(r) for r in rows)
    assert all(1 <= len(r["token_ids"]) - r["start"] <= 6 for r in rows)  # token_ids: prompt + completion
    metrics = json.loads(stats.read_text())
    assert "spec/accept_length" in metrics
    num_tokens = sum(len(r["token_ids"]) - r["start"] for r in rows)
    assert metrics["generate/seconds"] > 0
    assert metrics["generate/tok_s"] * metrics["generate/seconds"] == pytest.approx(num_tokens)
    assert f"{num_tokens} tokens in {metrics['generate/seconds']:.2f} s ({metrics['generate/tok_s']:.1f} tok/s" \
        in capsys.readouterr().out


def test_generate_filter_drafts(use_cache, tmp_path):
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    assert main(["generate", "--mode", "rs", "--top-k", "5", "--top-p", "0.9", "--filter-drafts", "--num-prompts", "2",
                 "--max-new-tokens", "6", "--out", str(out), "--stats-json", str(stats)]) == 0
    assert len(out.read_text().splitlines()) == 2 and "spec/alpha_rs" in json.loads(stats.read_text())


def test_generate_num_drafts(use_cache, tmp_path, capsys):
    out = tmp_path / "out.jsonl"
    assert main(["generate", "--mode", "rs", "--num-drafts", "2", "--num-prompts", "2", "--max-new-tokens", "6",
                 "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2
    for extra, message in ((["--mode", "to"], "needs mode rs and verify token"),
                           (["--backend", "vllm"], "needs backend engine")):
        assert main(["generate", "--num-drafts", "2", *extra, "--num-prompts", "2", "--out",
                     str(tmp_path / "refused.jsonl")]) != 0
        assert message in error_line(capsys)
    assert not (tmp_path / "refused.jsonl").exists()
    assert main(["check-lossless", "--num-drafts", "2", "--verify", "block"]) == 2
    assert "needs mode rs and verify token" in error_line(capsys)
    status = main(["check-lossless", "--num-drafts", "2", "--samples", "300", "--tested-prompts", "1"])
    assert status in (0, 1, 3) and "| rs K=3 T=1 n=2, token 12 |" in capsys.readouterr().out


def test_train_mtp_other_loss_and_resume(use_cache, tmp_path):
    out = tmp_path / "head"
    assert main(["train-mtp", "--loss", "rkl", "--steps", "2", "--batch-size", "4", "--out", str(out)]) == 0
    assert main(["train-mtp", "--loss", "rkl", "--steps", "3", "--batch-size", "4", "--out", str(out),
                 "--resume"]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]


def test_missing_model_dir(tmp_path, capsys):
    assert main(["generate", "--model", str(tmp_path / "nope"), "--mode", "none", "--out", str(tmp_path / "o")]) == 2
    assert "no config.json" in error_line(capsys)


def test_unknown_config_key(use_cache, tmp_path, capsys):
    cfg = tmp_path / "mtp.toml"
    cfg.write_text("# bebop train-mtp --config mtp.toml\nloss = 'tv'\nlearning_rate = 1e-3\n")
    assert main(["train-mtp", "--config", str(cfg), "--out", str(tmp_path / "h")]) == 2
    assert "unknown config file keys ['learning_rate']" in error_line(capsys)
    assert not (tmp_path / "h").exists()


def test_mismatched_head(use_cache, tmp_path, capsys):
    from bebop.mtp import MtpHead
    from tests.helpers.models import tiny_model

    MtpHead(tiny_model(hidden_size=32)).save_pretrained(tmp_path / "head")
    assert main(["eval-mtp", "--mtp", str(tmp_path / "head"), "--num-sequences", "4"]) == 2
    assert "hidden_size=32" in error_line(capsys)


def test_empty_prompts_file(use_cache, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n")
    assert main(["generate", "--prompts", str(prompts), "--mode", "none", "--out", str(tmp_path / "o")]) == 2
    assert "holds no prompt" in error_line(capsys)
    assert not (tmp_path / "o").exists()


def test_too_long_prompt(use_cache, tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("Q " + " + ".join(["1"] * 200) + " = ?\n")
    assert main(["generate", "--prompts", str(prompts), "--mode", "none", "--out", str(tmp_path / "o")]) == 2
    assert "prompt too long" in error_line(capsys)


def test_console_entry_point_help():
    out = subprocess.run([sys.executable, "-m", "bebop.cli", "--help"], capture_output=True, text=True, check=True)
    for command in ("pretrain", "train-mtp", "eval-mtp", "generate"):
        assert command in out.stdout


def test_rl_resume_and_report(use_cache, tmp_path):
    run = tmp_path / "run"
    common = ["--mode", "rs", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8",
              "--save-every", "1"]
    assert main(["rl", "--out", str(run), "--steps", "1", *common]) == 0
    assert main(["rl", "--resume", str(run), "--steps", "2"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["mode"] == "rs" and rows[0]["spec/accept_length"] >= 1.0
    assert main(["report", str(run), "--out", str(tmp_path / "report")]) == 0
    assert "rs" in (tmp_path / "report" / "report.md").read_text()


def test_rl_config_file_and_unknown_key(use_cache, tmp_path, capsys):
    cfg = tmp_path / "rl.yaml"
    cfg.write_text("# bebop rl --config rl.yaml\nmode: none\nsteps: 1\nprompts_per_step: 2\ngroup_size: 2\n"
                   "max_new_tokens: 4\nlearning_rate: 0.1\n")
    assert main(["rl", "--config", str(cfg), "--out", str(tmp_path / "r")]) == 2
    assert "learning_rate" in error_line(capsys)


def test_check_lossless_small(use_cache, capsys):
    """The verdict comes first and is the exit code; each tested prompt gets its own checks."""
    from bebop.check.verdict import VERDICT_EXIT_CODES

    status = main(["check-lossless", "--samples", "300", "--tested-prompts", "2"])
    out, err = capsys.readouterr()
    verdict = out.split(":")[0].lower()
    assert verdict in VERDICT_EXIT_CODES and status == VERDICT_EXIT_CODES[verdict] and "False-alarm odds" in out
    assert "testing 2 prompt(s)" in err and "(the embedded task's; --prompts gives your own)" in err
    assert "Tested prompts: 'Q " in out and " informative" in out  # which prompts, and how many checks compared something
    assert "prompt 2, tokens 5 & 6 (joint)" in out and ", prompt 1, token 12 |" in out  # K = 3 reaches token 3K + 3


def test_generate_output_is_train_and_eval_data(tmp_path, capsys):
    """`generate`'s JSONL is `train-mtp`/`eval-mtp` --data as is: whole sequences (prompt included), one BOS
    (a BOS-adding Llama-style tokenizer), text and chat prompts encoded as generation saw them."""
    from bebop.mtp.data import load_sequences
    from bebop.utils.tokens import encode_prompt
    from tests.helpers.cli import save_model_dir
    from tests.helpers.models import tiny_model, tiny_tokenizer

    model = save_model_dir(tmp_path / "model", tiny_model("llama", vocab_size=16))
    prompts = [{"prompt": "a b c"}, {"prompt": [{"role": "user", "content": "d e"}]}, {"prompt": "f"}] * 2
    (tmp_path / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    gen = tmp_path / "gen.jsonl"
    assert main(["generate", "--model", str(model), "--mode", "none", "--prompts", str(tmp_path / "prompts.jsonl"),
                 "--max-new-tokens", "8", "--out", str(gen)]) == 0
    rows = [json.loads(line) for line in gen.read_text().splitlines()]
    tok = tiny_tokenizer()
    for row, p in zip(rows, prompts):
        assert row["token_ids"][: row["start"]] == encode_prompt(tok, p["prompt"])
        prompt_ids = row["token_ids"][: row["start"]]  # (a random model may sample BOS in its completion)
        assert prompt_ids.count(tok.bos_token_id) == 1 and prompt_ids[0] == tok.bos_token_id
    assert load_sequences(gen, tok).token_ids == [r["token_ids"] for r in rows if len(r["token_ids"]) >= r["start"] + 2]
    head = tmp_path / "head"
    assert main(["train-mtp", "--model", str(model), "--data", str(gen), "--out", str(head), "--steps", "2",
                 "--batch-size", "2", "--speculate-k", "2"]) == 0
    assert main(["eval-mtp", "--model", str(model), "--mtp", str(head), "--data", str(gen), "--speculate-k", "2",
                 "--json", str(tmp_path / "eval.json")]) == 0
    assert json.loads((tmp_path / "eval.json").read_text())["num_positions"] > 0


def test_generate_auto_logs_the_decision(use_cache, tmp_path, capsys):
    out, stats = tmp_path / "out.jsonl", tmp_path / "stats.json"
    assert main(["generate", "--mode", "auto", "--speculate-k", "auto", "--num-prompts", "3", "--max-new-tokens", "8",
                 "--out", str(out), "--stats-json", str(stats)]) == 0
    metrics = json.loads(stats.read_text())
    assert metrics["auto/mode"] in ("none", "to", "rs") and 0 <= metrics["auto/speculate_k"] <= 4
    assert metrics["auto/predicted_tok_s"] == max(metrics["auto/predictions"].values()) > 0
    assert len(metrics["auto/predictions"]) == 9 and "auto: chose" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 3


def test_generate_auto_keeps_a_profile_between_calls(use_cache, tmp_path, capsys):
    """The first call with a profile probes and writes it; the next ones start from it and probe while the
    held decision awaits its confirming probe (``AutoChooser.settle``), then keep it without probing; a
    profile of another setup is refused in one line (exit 2) and left as it was, a corrupt one set
    aside as NAME.bad with a warning (tests/speculative/auto/test_profile.py has the rest); none writes
    nothing; a fixed setting refuses --auto-profile."""
    from bebop.speculative.auto import profile as profile

    path, stats = tmp_path / "auto.json", tmp_path / "stats.json"
    argv = ["generate", "--mode", "auto", "--speculate-k", "auto", "--num-prompts", "3", "--max-new-tokens", "8",
            "--out", str(tmp_path / "out.jsonl"), "--stats-json", str(stats), "--auto-profile", str(path)]
    assert main(argv) == 0 and "call 1: probing" in capsys.readouterr().out
    saved = json.loads(path.read_text())
    assert saved["version"] == profile.VERSION and saved["calls"] == 1 and saved["key"]["temperature"] == 1.0
    assert json.loads(stats.read_text())["auto/probed"] is True and not saved["chooser"]["held"]["confirmed"]
    calls = 1
    while not json.loads(path.read_text())["chooser"]["held"]["confirmed"]:  # each setting's first choice confirmed once
        assert main(argv) == 0 and f"call {calls + 1}: probing" in capsys.readouterr().out
        assert json.loads(stats.read_text())["auto/probed"] is True
        calls += 1
        assert calls <= 10  # at most one confirming probe per candidate setting (9)
    saved = json.loads(path.read_text())
    assert main(argv) == 0 and f"call {calls + 1}: keeping the last probe's choice, no probe" in capsys.readouterr().out
    metrics = json.loads(stats.read_text())
    assert metrics["auto/probed"] is False and "auto/priced" not in metrics
    assert (metrics["auto/mode"], metrics["auto/speculate_k"]) == (saved["chooser"]["held"]["mode"],
                                                                   saved["chooser"]["held"]["speculate_k"])
    assert json.loads(path.read_text())["calls"] == calls + 1
    good = path.read_text()
    assert main([*argv, "--temperature", "0.5"]) == 2 and "temperature differ" in error_line(capsys)
    path.write_text("{not json")  # corrupt: set aside with a warning, the call starts fresh and writes anew
    assert main(argv) == 0 and f"auto profile {path} is corrupt" in capsys.readouterr().err
    assert path.with_name(path.name + ".bad").read_text() == "{not json" and json.loads(path.read_text())["calls"] == 1
    path.write_text(good)

    def written():  # every profile file and its text: the default ones and ours
        root = use_cache / "auto-profiles"
        return {f: f.read_text() for f in [path, *(root.iterdir() if root.exists() else [])]}

    before = written()
    assert main([*argv[:-1], "none"]) == 0 and "profile" not in capsys.readouterr().out
    assert written() == before and not Path("none").exists()
    fixed = ["generate", "--mode", "rs", "--speculate-k", "3", *argv[5:]]
    assert main(fixed) == 2 and "--auto-profile needs" in error_line(capsys)


def test_rl_auto_probes_every_n_steps_and_keeps_the_choice_between(use_cache, tmp_path):
    """A step probes when it is scheduled (every --auto-every) or the step before chose a setting for the
    first time (auto/confirmed False); otherwise it keeps the last choice. tests/speculative/auto/test_chooser.py
    checks the keeping and the confirming with scripted choices."""
    run = tmp_path / "run"
    assert main(["rl", "--out", str(run), "--mode", "auto", "--speculate-k", "auto", "--auto-every", "3",
                 "--steps", "4", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["auto/probed"] and not rows[0]["auto/confirmed"]  # a run's first choice is confirmed next step
    held = ("auto/mode", "auto/speculate_k")
    for step in range(1, len(rows)):
        assert rows[step]["auto/probed"] == (step % 3 == 0 or not rows[step - 1]["auto/confirmed"])
        if not rows[step]["auto/probed"]:  # between probes: the choice kept, no probe
            assert [rows[step][f] for f in held] == [rows[step - 1][f] for f in held] and rows[step]["auto/confirmed"]
    for r in rows:
        assert r["auto/mode"] in ("none", "to", "rs") and r["auto/predicted_tok_s"] > 0
        assert r["auto/measured_tok_s"] is None or r["auto/measured_tok_s"] > 0  # None: all rows ended in the probe
    assert json.loads((run / "config.json").read_text())["speculate_k"] == "auto"


@pytest.mark.parametrize("argv, message", [
    (["generate", "--speculate-k", "0"], "speculate_k must be an integer >= 1 or 'auto', got 0"),
    (["rl", "--speculate-k", "0", "--steps", "1"], "speculate_k must be an integer >= 1 or 'auto', got 0"),
    (["rl", "--mode", "auto", "--backend", "vllm", "--steps", "1"], "needs backend engine"),
])
def test_bad_auto_values_are_one_line(tmp_path, capsys, argv, message):
    assert main([*argv, "--out", str(tmp_path / "o")]) == 2
    assert message in error_line(capsys) and not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv, message", [
    (["generate", "--mode", "foo"], "invalid choice: 'foo'"),
    (["rl", "--mode", "foo"], "invalid choice: 'foo'"),  # every command's choices come from one declaration
    (["generate", "--speculate-k", "deep"], "expected an integer or 'auto', got 'deep'"),
])
def test_bad_auto_flags_are_argparse_errors(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err.strip().splitlines()[-1]


def test_train_mtp_has_a_flag_per_config_field(capsys):
    """train-mtp's flags are ``TrainMtpConfig``'s fields (type, choices, help); an unset flag leaves the value
    to the config file or the default."""
    import dataclasses

    from bebop.cli import build_parser
    from bebop.mtp.config import TrainMtpConfig

    args = build_parser().parse_args(["train-mtp", "--grad-clip", "0.5", "--log-every", "5", "--init", "backbone"])
    assert (args.grad_clip, args.log_every, args.init, args.loss, args.steps) == (0.5, 5, "backbone", None, None)
    for f in dataclasses.fields(TrainMtpConfig):
        assert hasattr(args, f.name)
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["train-mtp", "--loss", "kl2"])
    assert exit_info.value.code == 2 and "invalid choice: 'kl2'" in capsys.readouterr().err


def test_verify_block_flags(use_cache, tmp_path, capsys):
    """--verify block runs with mode rs and the engine; any other mode or backend is one line, exit 2."""
    out = tmp_path / "out.jsonl"
    common = ["--num-prompts", "2", "--max-new-tokens", "6", "--out", str(out)]
    assert main(["generate", "--mode", "rs", "--verify", "block", *common]) == 0
    assert len(out.read_text().splitlines()) == 2
    assert main(["generate", "--mode", "to", "--verify", "block", *common[:-2], "--out", str(tmp_path / "o")]) == 2
    assert "verify block needs mode rs" in error_line(capsys)
    assert main(["check-lossless", "--verify", "block", "--backend", "vllm"]) == 2
    assert "verify block needs backend engine" in error_line(capsys)
    assert main(["rl", "--mode", "to", "--verify", "block", "--out", str(tmp_path / "r")]) == 2
    assert "verify block needs mode rs" in error_line(capsys)
    status = main(["check-lossless", "--verify", "block", "--samples", "300", "--tested-prompts", "1"])
    assert status in (0, 1, 3) and "| rs block K=3 T=1, token 12 |" in capsys.readouterr().out
