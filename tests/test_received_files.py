"""Files a user receives (a run directory, a head, a model, data, a config file): every number and every
nesting in them is checked before it is trusted. Each bad file gives one line naming it, exit 2, no
traceback, no hang, and nothing written or lost."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest

from bebop.cli import main
from bebop.utils.errors import BebopError
from bebop.utils.files import read_json, read_jsonl
from tests.helpers.cli import model_workdir, save_model_dir
from tests.helpers.models import tiny_model, tiny_tokenizer

DEPTH = 5000  # nesting levels: beyond Python's recursion limit, so json.loads raised RecursionError
DEEP = "[" * DEPTH + "]" * DEPTH
BILLION_LAUGHS = "".join(["# bebop rl --config laughs.yaml\nlabel: [&a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"] +
                         [f", &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefg", "bcdefgh")] + ["]\n"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A model (whole and sharded), its head, data, and a one-step run to copy and damage."""
    root = model_workdir(tmp_path_factory.mktemp("received"))
    tiny_model("llama", vocab_size=16).save_pretrained(root / "sharded", max_shard_size="20KB")
    tiny_tokenizer().save_pretrained(root / "sharded")
    save_model_dir(root / "hybrid", tiny_model("qwen3_5_hybrid", vocab_size=16))  # Gated DeltaNet x3, attention
    tiny_model("qwen3", vocab_size=16).save_pretrained(root / "no-tokenizer")  # transformers builds an empty one
    mp = pytest.MonkeyPatch()
    mp.chdir(root)  # NOTE: the run records its reward as given, a module found from here
    assert main(["rl", "--model", "model", "--mtp", "head", "--data", "prompts.jsonl", "--out", "run", "--mode", "none",
                 "--steps", "1", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "3", *RL]) == 0
    mp.undo()
    return root


RL = ["--reward", "rewards:score", "--threads", "1"]
GEN = ["generate", "--model", "model", "--mtp", "head", "--prompts", "prompts.jsonl", "--max-new-tokens", "2",
       "--out", "out.jsonl", "--threads", "1"]


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _damaged_head(root: Path, name: str, **changes) -> str:
    shutil.copytree(root / "head", root / name, dirs_exist_ok=True)
    _edit_json(root / name / "mtp_config.json", **changes)
    return name


def _written(path: Path, text: str, argv: list[str]) -> list[str]:
    path.write_text(text)
    return argv


def _sharded(root: Path, name: str, damage) -> str:
    shutil.copytree(root / "sharded", root / name, dirs_exist_ok=True)
    damage(root / name)
    return name


def _model_copy(root: Path, name: str, source: str = "model", config=None, weights=None) -> str:
    """A copy of a model directory with its config.json edited (``config(dict)``) or its weights
    (``weights(state dict)``)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(root / source, root / name, dirs_exist_ok=True)
    if config is not None:
        values = json.loads((root / name / "config.json").read_text())
        config(values)
        (root / name / "config.json").write_text(json.dumps(values))
    if weights is not None:
        state = load_file(str(root / name / "model.safetensors"))
        weights(state)
        save_file(state, str(root / name / "model.safetensors"), metadata={"format": "pt"})
    return name


def _gen(model: str) -> list[str]:
    return [*GEN[:2], model, *GEN[3:]]


def _truncate_second_shard(directory: Path) -> None:
    shard = sorted(directory.glob("model-*.safetensors"))[1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


CASES = {  # case -> (argv built in the workdir, the line it must give (a substring))
    "a head config with num_layers 1000000 (it built a million layers)": (
        lambda root: [*GEN[:4], _damaged_head(root, "head-big", num_layers=1_000_000), *GEN[5:]],
        "corrupt MTP head config head-big/mtp_config.json: num_layers is 1000000 but the weights hold 1 layer(s)"),
    "a head config with num_layers '1'": (
        lambda root: [*GEN[:4], _damaged_head(root, "head-text", num_layers="1"), *GEN[5:]],
        "corrupt MTP head config head-text/mtp_config.json: num_layers should be int, got '1'"),
    "a head config with num_layers 1.5": (
        lambda root: [*GEN[:4], _damaged_head(root, "head-float", num_layers=1.5), *GEN[5:]],
        "num_layers should be int, got '1.5'"),
    "a checkpoint index that is not JSON": (
        lambda root: [*GEN[:2], _sharded(root, "bad-index", lambda d: (d / "model.safetensors.index.json").write_text(
            "{not json")), *GEN[3:]],
        "cannot load model from bad-index: model file bad-index/model.safetensors.index.json is not valid JSON"),
    "a truncated shard": (
        lambda root: [*GEN[:2], _sharded(root, "cut-shard", _truncate_second_shard), *GEN[3:]],
        "cannot load model from cut-shard: weights file model-00002-of-"),
    # Sizes from a received config.json, checked against the weights before the model is built (they hung,
    # or ended in transformers' mismatch table).
    "num_hidden_layers 100000 (Llama)": (
        lambda root: _gen(_model_copy(root, "deep-llama", config=lambda c: c.update(num_hidden_layers=100_000))),
        "deep-llama/config.json declares num_hidden_layers=100000 but the weights hold 2 layer(s)"),
    "num_hidden_layers 100000 (hybrid)": (
        lambda root: _gen(_model_copy(root, "deep-hybrid", "hybrid", config=lambda c: c.update(
            num_hidden_layers=100_000, layer_types=["full_attention"] * 100_000))),
        "deep-hybrid/config.json declares num_hidden_layers=100000 but the weights hold 4 layer(s)"),
    "an intermediate_size of 1e9": (
        lambda root: _gen(_model_copy(root, "wide", config=lambda c: c.update(intermediate_size=10**9))),
        "wide/config.json gives model.layers.0.mlp.gate_proj.weight the shape (1000000000, 32) but the weights hold "
        "(64, 32)"),
    "a vocab_size of 1e9": (
        lambda root: _gen(_model_copy(root, "big-vocab", config=lambda c: c.update(vocab_size=10**9))),
        "big-vocab/config.json gives model.embed_tokens.weight the shape (1000000000, 32) but the weights hold "
        "(16, 32)"),
    # Weights the model needs and the files lack were initialised at random; extra ones were ignored.
    "a weight tensor missing": (
        lambda root: _gen(_model_copy(root, "no-up", weights=lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))),
        "model no-up lacks weights model.layers.1.mlp.up_proj.weight: its config.json and its weights do not"),
    "a weight tensor the model has no place for": (
        lambda root: _gen(_model_copy(root, "extra", weights=lambda w: w.update(
            {"model.layers.1.extra.weight": w["model.norm.weight"].clone()}))),
        "model extra holds unexpected weights model.layers.1.extra.weight: its config.json and its weights"),
    "a hybrid whose layer_types do not match its weights": (
        lambda root: _gen(_model_copy(root, "swapped", "hybrid", config=lambda c: c.update(
            layer_types=["full_attention", *c["layer_types"][1:]]))),
        "model swapped lacks weights model.layers.0.self_attn.k_norm.weight, model.layers.0.self_attn.k_proj.weight"),
    # A hybrid's layer_types that transformers' config validator refuses (a traceback before).
    "a hybrid layer_types with an unknown entry": (
        lambda root: _gen(_model_copy(root, "bogus-type", "hybrid", config=lambda c: c.update(
            layer_types=["bogus", *c["layer_types"][1:]]))),
        "model config bogus-type/config.json cannot be used: ValueError: The `layer_types` entries must be in"),
    "a hybrid layer_types shorter than num_hidden_layers": (
        lambda root: _gen(_model_copy(root, "short-types", "hybrid", config=lambda c: c.update(
            layer_types=c["layer_types"][:2]))),
        "short-types/config.json cannot be used: ValueError: `num_hidden_layers` (4) must be equal to the number of "
        "`layer_types` (2)"),
    "a model of a family transformers does not know, with its own code (auto_map)": (
        lambda root: _gen(_model_copy(root, "custom", config=lambda c: c.update(
            model_type="custom_lm", auto_map={"AutoConfig": "code.CustomConfig"}))),
        "custom/config.json cannot be used: model_type 'custom_lm' needs the directory's own code (auto_map), and "
        "Bebop never runs a received model's code"),
    "a model directory without tokenizer files": (
        lambda root: _gen("no-tokenizer"),
        "no usable tokenizer in no-tokenizer: it holds only the special token(s) <|endoftext|> (transformers built "
        "it from the config alone); give --tokenizer DIR"),
    "--tokenizer without --model": (
        lambda root: ["generate", "--tokenizer", "model", "--out", "out.jsonl", "--threads", "1"],
        "--tokenizer needs --model: the embedded model has its own tokenizer"),
    "prompts nested thousands of levels (generate)": (
        lambda root: _written(root / "deep.jsonl", '{"prompt": %s}\n' % DEEP, [*GEN[:6], "deep.jsonl", *GEN[7:]]),
        "deep.jsonl:1 is not valid JSON here: it nests arrays or objects deeper than"),
    "data nested thousands of levels (train-mtp)": (
        lambda root: _written(root / "deep-data.jsonl", '{"token_ids": %s}\n' % DEEP, [
            "train-mtp", "--model", "model", "--data", "deep-data.jsonl", "--out", "new-head", "--threads", "1"]),
        "data file deep-data.jsonl line 1 is not valid JSON here"),
    "a YAML billion laughs in a valid key (rl --config)": (
        lambda root: _written(root / "laughs.yaml", BILLION_LAUGHS, [
            "rl", "--model", "model", "--data", "prompts.jsonl", "--out", "new-run", "--config", "laughs.yaml", *RL]),
        "config key 'label' should be str, got [['lol', 'lol', 'lol', 'lol', ...], [[...], "),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_received_file_is_one_line(case, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    argv = CASES[case][0](workdir)
    before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert "Traceback" not in "\n".join(err) and CASES[case][1] in err[-1], err[-1]
    assert len(err[-1]) < 300  # one short line, whatever the file holds
    assert {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()} == before  # nothing written or changed


def _copied_run(root: Path, name: str) -> Path:
    shutil.rmtree(root / name, ignore_errors=True)
    shutil.copytree(root / "run", root / name)
    return root / name


RUN_DAMAGE = {  # case -> what is done to the copied run, the line it must give (a substring)
    "a checkpoint's step of -5 (it trained and logged steps -4..0)": (
        lambda run: _edit_json(run / "checkpoint" / "trainer_state.json", step=-5),
        "trainer_state.json says step -5, which a run of 1 steps never reaches"),
    "a checkpoint's step of 1e12 (it reported 'run written' with nothing trained)": (
        lambda run: _edit_json(run / "checkpoint" / "trainer_state.json", step=10**12),
        "says step 1000000000000, which a run of 1 steps never reaches"),
    "a run config nested thousands of levels": (
        lambda run: (run / "config.json").write_text(DEEP), "run config run-"),
    "a run config that is a list": (
        lambda run: (run / "config.json").write_text("[1, 2]"), "is not a run's config"),
    "a run with speculate_k 1e9 (the error blamed rows and suggested flags --resume refuses)": (
        lambda run: [_edit_json(run / name, mode="rs", speculate_k=10**9)
                     for name in ("config.json", "checkpoint/config.json")],
        "speculate_k=1000000000 in run-"),
    "a run whose sizes need more memory than the machine has (it hung before the check)": (
        lambda run: [_edit_json(run / name, prompts_per_step=10**9) for name in ("config.json",
                                                                               "checkpoint/config.json")],
        "rollout rows need at least"),
}


@pytest.mark.parametrize("case", list(RUN_DAMAGE))
def test_a_damaged_received_run_is_refused_on_resume_and_kept(case, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    run = _copied_run(workdir, f"run-{list(RUN_DAMAGE).index(case)}")
    damage, message = RUN_DAMAGE[case]
    damage(run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert main(["rl", "--resume", run.name, "--steps", "3", *RL]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line.startswith("bebop: error: ") and message in line, line
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_json_readers_name_a_file_nested_beyond_the_parser(tmp_path):
    """Every JSON a command reads goes through these readers (TRL's trainer_state.json in reports included)."""
    (tmp_path / "trainer_state.json").write_text('{"log_history": %s}' % DEEP)
    (tmp_path / "rows.jsonl").write_text('{"a": 1}\n{"b": %s}\n' % DEEP)
    with pytest.raises(BebopError, match=r"^TRL log history .*trainer_state.json is not valid JSON here: it nests"):
        read_json(tmp_path / "trainer_state.json", "TRL log history")
    with pytest.raises(BebopError, match=r"rows.jsonl line 2 is not valid JSON here"):
        read_jsonl(tmp_path / "rows.jsonl", "metrics")
    assert read_jsonl(tmp_path / "rows.jsonl", "metrics", torn_tail_ok=True) == [{"a": 1}]  # a last line is droppable


def test_an_auto_profile_nested_beyond_the_parser_is_set_aside_as_every_corrupt_profile(workdir, monkeypatch, capsys):
    """A corrupt profile (RecursionError before) is moved to NAME.bad, kept byte for byte, and auto starts afresh."""
    monkeypatch.chdir(workdir)
    (workdir / "deep-profile.json").write_text(DEEP)
    assert main([*GEN[:-4], "--out", "auto.jsonl", "--threads", "1", "--mode", "auto", "--auto-profile",
                 "deep-profile.json"]) == 0
    assert "deep-profile.json is not valid JSON here: it nests" in capsys.readouterr().err
    assert (workdir / "deep-profile.json.bad").read_text() == DEEP



CUSTOM_CODE = """import pathlib
pathlib.Path({marker!r}).write_text("the model directory's code ran")
from transformers import LlamaConfig, LlamaForCausalLM
class CustomConfig(LlamaConfig):
    pass
class CustomModel(LlamaForCausalLM):
    config_class = CustomConfig
"""


def test_a_model_directory_s_code_never_runs_even_with_a_yes_on_stdin(workdir, monkeypatch, capsys):
    """`echo y | bebop generate --model M_with_auto_map ...` ran the directory's auto_map code (transformers
    asked "run the custom code? [y/N]" for a model_type it does not know): now nothing is asked, such a
    model is refused in one line, and a known family with an auto_map loads transformers' own classes."""
    monkeypatch.chdir(workdir)
    marker = workdir / "code-ran"
    auto_map = {"AutoConfig": "custom.CustomConfig", "AutoModelForCausalLM": "custom.CustomModel"}
    for name, model_type in (("custom-type", "custom_lm"), ("llama-with-code", "llama")):
        _model_copy(workdir, name, config=lambda c: c.update(model_type=model_type, auto_map=auto_map))
        (workdir / name / "custom.py").write_text(CUSTOM_CODE.format(marker=str(marker)))
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n" * 10))
    monkeypatch.setattr("builtins.input", lambda *_: pytest.fail("Bebop asked a question on stdin"))
    argv = ["generate", "--mode", "none", "--prompts", "prompts.jsonl", "--max-new-tokens", "2", "--threads", "1"]
    assert main([*argv, "--model", "custom-type", "--out", "custom.jsonl"]) == 2
    assert "Bebop never runs a received model's code" in capsys.readouterr().err
    assert main([*argv, "--model", "llama-with-code", "--out", "with-code.jsonl"]) == 0
    assert not marker.exists() and (workdir / "with-code.jsonl").is_file() and not (workdir / "custom.jsonl").exists()
    (workdir / "with-code.jsonl").unlink()


def test_tokenizer_from_another_directory(workdir, monkeypatch, capsys):
    """A model directory without tokenizer files is refused (above); --tokenizer DIR gives it one, on every
    command that takes --model; export-mtp copies that tokenizer into the served directory."""
    monkeypatch.chdir(workdir)
    assert main([*_gen("no-tokenizer")[:-4], "--out", "tok.jsonl", "--mode", "none", "--tokenizer", "model",
                 "--threads", "1"]) == 0
    rows = [json.loads(line) for line in (workdir / "tok.jsonl").read_text().splitlines()]
    assert rows[0]["token_ids"][:3] == [1, 4, 5]  # "a b" as the tiny tokenizer encodes it
    (workdir / "tok.jsonl").unlink()
    from bebop.cli import COMMANDS, _settings

    takes_model = [name for name, command in COMMANDS.items() if "model" in _settings(command)]
    assert takes_model and all("tokenizer" in _settings(COMMANDS[name]) for name in takes_model)


def test_a_received_run_s_markdown_link_is_not_live_in_the_report(workdir, monkeypatch):
    """A label `[x](javascript:...)` in a received run's config.json was copied live into report.md."""
    monkeypatch.chdir(workdir)
    run = _copied_run(workdir, "run-link")
    _edit_json(run / "config.json", label="[click](javascript:alert(1))")
    assert main(["report", "run-link", "--out", "report-link"]) == 0
    text = (workdir / "report-link" / "report.md").read_text()
    assert "\\[click\\](javascript:alert(1))" in text and "[click](javascript:" not in text
    shutil.rmtree(workdir / "report-link")


def test_a_trl_log_history_that_is_a_directory_is_named(tmp_path, capsys):
    """A trainer_state.json that is a directory read as "run config not found"."""
    (tmp_path / "trl-out" / "trainer_state.json").mkdir(parents=True)
    assert main(["report", str(tmp_path / "trl-out")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    state = tmp_path / "trl-out" / "trainer_state.json"
    assert line == f"bebop: error: TRL log history {state} is a directory, not a file"
