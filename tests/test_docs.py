"""Every command the documentation shows runs as written in a test, or is listed here with its reason.

The fenced ``bash``, ``python`` and ``yaml`` blocks of README.md, docs/*.md and bench/README.md
(``tests.helpers.doc_blocks.DOC_FILES``) are each named, by file and first line, in exactly one of:

- ``RUN_HERE``: run as written by a test of this module, in a fresh directory holding the files the
  docs say a reader brings (tiny random models); commands that cannot run here are skipped by
  ``SKIPPED_COMMANDS``, with their reason;
- ``RUN_ELSEWHERE``: run as written by the named test of another module;
- ``FLAGS_ONLY``: benchmarks of minutes, whose every command is parsed by the script's own
  argument parser (so a flag that does not exist fails) but not run;
- ``NOT_RUN``: blocks that cannot run on this machine, with the reason.

A new block that is in none of them, or a listed block the docs no longer have, fails
``test_every_block_is_run_or_listed``. Blocks of other languages (``text``) are not commands.
``NAME=value`` settings take the tiny values of ``TINY`` (the README's walkthrough sizes and
``STEPS``), as tests/test_readme.py does for the walkthrough.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import inspect
import os
import re
import runpy
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import bebop
from bebop.cli import main
from tests.helpers.cli import fill_tiny_cache, save_model_dir
from tests.helpers.doc_blocks import DOC_FILES, REPO, SETTING, Block, command_lines, expand, fenced_blocks
from tests.helpers.models import WORDS, tiny_model
from tests.test_readme import TINY as WALKTHROUGH_SIZES

COMMAND_LANGUAGES = ("bash", "python", "yaml")  # blocks that are commands, code or configs
PROSE_LANGUAGES = ("text",)  # blocks that are not (the README's package map)
TINY = {**WALKTHROUGH_SIZES, "STEPS": "2"}  # every NAME=value setting of the docs, sized for a test

RUN_HERE = {  # (file, first line's start) -> the test of this module that runs the block
    ("README.md", "bebop export-mtp --model ./Qwen3.5-9B --mtp ./my-head"): "test_export_blocks_run_as_written",
    ("README.md", "torchrun --nproc-per-node 2 $(which bebop) train-mtp --model $MODEL"):
        "test_torchrun_block_runs_as_written",
    ("docs/export.md", "# From a checkpoint that ships an MTP layer"): "test_export_blocks_run_as_written",
    ("docs/trainers.md", "bebop train-mtp --model ./Qwen3.5-9B"): "test_export_blocks_run_as_written",
    ("docs/trainers.md", "bebop train-mtp --model ckpt/step_400/hf"): "test_export_blocks_run_as_written",
}
WALKTHROUGH = "tests/test_readme.py::test_walkthrough_runs_as_written"
TRL_EXAMPLE = "tests/integrations/test_trl_example.py::test_documented_commands_run_as_written"
RUN_ELSEWHERE = {  # (file, first line's start) -> "test file::test" that runs the block as written
    ("README.md", "MODEL=./my-model"): WALKTHROUGH,
    ("README.md", "bebop generate --model $MODEL"): WALKTHROUGH,
    ("README.md", "bebop train-mtp --model $MODEL"): WALKTHROUGH,
    ("README.md", "bebop eval-mtp --model $MODEL"): WALKTHROUGH,
    ("README.md", "bebop check-lossless --model $MODEL"): WALKTHROUGH,
    ("README.md", "# my_rewards.py"): WALKTHROUGH,
    ("README.md", "bebop rl --model $MODEL"): WALKTHROUGH,
    ("README.md", "from bebop import models, mtp, speculative"): WALKTHROUGH,
    ("docs/layout.md", "from dataclasses import dataclass"):
        "tests/speculative/test_settings_declared.py::test_layout_worked_example_runs_as_written",
    ("README.md", "python examples/trl_grpo.py --max-steps 20 --output-dir runs/trl-none"): TRL_EXAMPLE,
    ("docs/trainers.md", "python examples/trl_grpo.py --max-steps 20 --output-dir runs/trl-grpo"): TRL_EXAMPLE,
}
FLAGS_ONLY = {  # (file, first line's start) -> why the benchmark is not run
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/rollout.py --quick"):
        "timing tables of minutes (`--quick` about 1 minute on 2 cores, the full grid far longer)",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/block_accept.py"): "about 2 minutes",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/draft_loss.py"):
        "full-vocabulary losses (V = 151,936) in fresh processes: minutes and gigabytes; one line needs CUDA",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/rl_async.py"): "A/B RL runs of minutes",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/ddp.py"): "about 3 minutes of torchrun runs",
    ("bench/README.md", "PYTHONPATH=. .venv-vllm/bin/python bench/rl_backends.py"):
        "needs vLLM (`make test-vllm`'s venv) and minutes",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python -m bench.auto grid --threads 1"):
        "27 minutes for the bar; `--quick` about 1 minute",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/trl_step.py"): "about 3 minutes of TRL steps",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/lossless_verdict.py"):
        "hundreds of check-lossless runs: 15-60 minutes on 2 shared cores",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/hybrid.py --quick"):
        "3-6 minutes: two heads trained, then timed calls; one line needs CUDA",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/scale.py --quick"):
        "a 187 M-parameter model in a fresh process per point: 12 minutes for --quick, about an hour in full",
    ("bench/README.md", "PYTHONPATH=. .venv/bin/python bench/tail.py --quick"):
        "three modes decoding batches of hundreds of tokens a row: minutes for --quick, half an hour in full",
}
NOT_RUN = {  # (file, first line's start) -> why the block cannot run here
    ("README.md", "make demo"): "`make demo` is `bebop demo` (13 minutes; tests/test_demo.py runs `bebop demo "
                                "--quick`) and `make test` is this suite",
    ("README.md", "git clone URL bebop"): "clones the reader's URL and installs into the running environment; "
                                          "`make install` runs the same pip install (editable) in a fresh venv, "
                                          "and test_install_lines_name_this_distribution checks the names",
    ("README.md", "from bebop.integrations.trl import bebop_rollout_func"):
        "a sketch around the reader's model, tokenizer, reward and data (`GRPOConfig(...)`); examples/trl_grpo.py is "
        "it filled in, run by tests/integrations/test_trl_example.py",
    ("docs/trainers.md", "from bebop.integrations.trl import bebop_rollout_func"):
        "the same sketch; the TRL section's commands are run by tests/integrations (test_trl.py, test_trl_example.py)",
    ("docs/export.md", "bebop generate --backend vllm --mode rs --out samples.jsonl"):
        "needs vLLM, which lives in `make test-vllm`'s venv (tests/vllm runs these paths there)",
    ("docs/scaling.md", "torchrun --nproc-per-node 2 $(which bebop) train-mtp --model MODEL_DIR"):
        "minutes each (300 head steps, 100 RL steps, FSDP over 8 processes) on the reader's model; "
        "tests/utils/test_distributed.py runs train-mtp, eval-mtp and rl as 2 gloo processes and compares them with "
        "one, and test_torchrun_block_runs_as_written runs the README's torchrun line",
    ("docs/trainers.md", "python -m verl.trainer.main_ppo"): "verl is not installed here (Ray, GPUs); the keys were "
                                                              "read in verl's sources",
    ("docs/trainers.md", "--hf-checkpoint ./Qwen3.5-9B-tv"): "slime's launch flags: slime and SGLang are not "
                                                             "installed here (GPUs)",
    ("docs/trainers.md", "policy:"): "a NeMo-RL config: NeMo-RL is not installed here (Ray, GPUs)",
    ("docs/vllm.md", "make test-vllm"): "builds the 3.6 GB vLLM venv; `make test-vllm` is its own target",
    ("docs/vllm.md", ".venv-vllm/bin/bebop generate --backend vllm   --mode rs"):
        "runs in `make test-vllm`'s venv (tests/vllm/test_vllm_cpu_fix.py compares the two backends there)",
    ("bench/README.md", "make test-vllm    # builds .venv-vllm once"): "builds the 3.6 GB vLLM venv, then "
                                                                      "bench/vllm_compare.py in it",
    ("bench/README.md", "PYTHON=.venv/bin/python bash bench/gpu_smoke.sh"):
        "needs an NVIDIA GPU; its CPU dry run takes minutes (it builds an empty cache first); "
        "test_gpu_scripts_parse checks the script with `bash -n`",
    ("bench/README.md", "PYTHON=.venv/bin/python bash bench/gpu_headline.sh"):
        "needs an NVIDIA GPU; its CPU dry run takes minutes (it trains the embedded model's head when missing); "
        "test_gpu_scripts_parse checks the script with `bash -n`",
}
SKIPPED_COMMANDS = {  # the start of a command inside a RUN_HERE block -> why it is not run
    "vllm serve": "serving on a GPU; vLLM's MTP decoding of an exported head runs on CPU under `make test-vllm`",
    "python -m sglang.launch_server": "SGLang is not installed here",
}
SUBSTITUTIONS = {"$(which bebop)": str(Path(sys.executable).parent / "bebop")}  # the one shell construct used


def _listed(block: Block) -> list[str]:
    """The lists that name ``block``."""
    lists = {"RUN_HERE": RUN_HERE, "RUN_ELSEWHERE": RUN_ELSEWHERE, "FLAGS_ONLY": FLAGS_ONLY, "NOT_RUN": NOT_RUN}
    return [name for name, entries in lists.items() for path, start in entries
            if path == block.path and block.first_line.startswith(start)]


def doc_blocks() -> list[Block]:
    """The documentation's command blocks (``COMMAND_LANGUAGES``)."""
    return [b for path in DOC_FILES for b in fenced_blocks(path) if b.language in COMMAND_LANGUAGES]


def find_block(path: str, start: str) -> Block:
    (block,) = [b for b in doc_blocks() if b.path == path and b.first_line.startswith(start)]
    return block


def test_every_block_is_run_or_listed():
    blocks = [b for path in DOC_FILES for b in fenced_blocks(path)]
    odd = [f"{b.path}:{b.line} ({b.language or 'no language'})" for b in blocks
           if b.language not in COMMAND_LANGUAGES + PROSE_LANGUAGES]
    assert not odd, f"fenced blocks need a language of {COMMAND_LANGUAGES + PROSE_LANGUAGES}: {odd}"
    unlisted = [f"{b.path}:{b.line} {b.first_line!r}" for b in doc_blocks() if len(_listed(b)) != 1]
    assert not unlisted, f"each block must be in exactly one list of tests/test_docs.py: {unlisted}"
    for entries in (RUN_HERE, RUN_ELSEWHERE, FLAGS_ONLY, NOT_RUN):
        for path, start in entries:
            matches = [b for b in doc_blocks() if b.path == path and b.first_line.startswith(start)]
            assert len(matches) == 1, f"{path}: {len(matches)} blocks start with {start!r}"


def test_the_lists_name_tests_that_exist():
    here = Path(__file__).read_text()
    assert all(f"\ndef {name}(" in here for name in RUN_HERE.values())
    for target in RUN_ELSEWHERE.values():
        file, name = target.split("::")
        assert f"\ndef {name}(" in (REPO / file).read_text(), target


# --------------------------------------------------------------------------------------------
# Running blocks
# --------------------------------------------------------------------------------------------


def _command_words(line: str, settings: dict[str, str]) -> list[str]:
    for construct, value in SUBSTITUTIONS.items():
        line = line.replace(construct, shlex.quote(value))
    return [expand(w, settings) for w in shlex.split(line, comments=True)]


def run_shell_block(block: Block, settings: dict[str, str]) -> list[str]:
    """Runs ``block``'s commands in the current directory; returns the commands it skipped (``SKIPPED_COMMANDS``)."""
    assert block.language == "bash", block
    skipped = []
    for line in command_lines(block.body):
        if (start := next((s for s in SKIPPED_COMMANDS if line.startswith(s)), None)) is not None:
            skipped.append(start)
            continue
        words = _command_words(line, settings)
        if len(words) == 1 and (setting := SETTING.match(words[0])):
            assert setting.group(1) in TINY, f"{block.path} sets {setting.group(1)}: give it a tiny value in TINY"
            settings[setting.group(1)] = TINY[setting.group(1)]
        elif words[0] == "bebop":
            assert main(words[1:]) == 0, f"{block.path}:{block.line}: {line}"
        elif words[0] == "torchrun":
            command = [str(Path(sys.executable).parent / "torchrun"), *words[1:]]
            done = subprocess.run(command, capture_output=True, text=True, timeout=600,
                                  env={**os.environ, "OMP_NUM_THREADS": "1"})
            assert done.returncode == 0, f"{line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        else:
            raise AssertionError(f"{block.path}:{block.line}: no runner for {line!r}")
    return skipped


def _native_checkpoint(directory: Path):
    """A tiny Qwen3.5 checkpoint that ships an MTP layer, with a tokenizer: what ./Qwen3.5-9B stands for."""
    from tests.helpers.native_checkpoints import save_native_checkpoint, save_word_tokenizer, tiny_backbone

    model = tiny_backbone("qwen3_5")
    save_native_checkpoint("qwen3_5", model, directory)
    save_word_tokenizer(directory)
    return model


def _text_rows(path: Path, num: int, seed: int) -> None:
    """Training text for train-mtp: ``{"text": ...}`` rows of the tokenizer's words."""
    import json
    import random

    rng = random.Random(seed)
    path.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(12))}) + "\n"
                            for _ in range(num)))


@pytest.mark.slow
def test_export_blocks_run_as_written(tmp_path, monkeypatch):
    """Head training, import and export on a tiny Qwen3.5 checkpoint named as the docs name it; serving skipped."""
    from bebop.mtp import MtpHead

    blocks = {path: [find_block(p, start) for (p, start), test in RUN_HERE.items()
                     if p == path and test == "test_export_blocks_run_as_written"]
              for path in ("README.md", "docs/export.md", "docs/trainers.md")}
    for path, path_blocks in blocks.items():
        directory = tmp_path / path.replace("/", "-")
        directory.mkdir()
        monkeypatch.chdir(directory)
        model = _native_checkpoint(directory / "Qwen3.5-9B")
        _text_rows(directory / "rft.jsonl", 16, seed=0)
        MtpHead(model).save_pretrained(directory / "my-head")  # README: the head the walkthrough trained
        _native_checkpoint(directory / "ckpt" / "step_400" / "hf")  # docs/trainers.md: a later policy checkpoint
        _text_rows(directory / "rollouts_400.jsonl", 16, seed=1)
        for block in path_blocks:
            skipped = run_shell_block(block, dict(TINY))
            assert set(skipped) <= set(SKIPPED_COMMANDS)
        for out in ("Qwen3.5-9B-tv", "ckpt/step_400/hf-tv"):
            if (directory / out).exists():  # an exported model directory: the backbone's config with its MTP field
                assert (directory / out / "model-mtp.safetensors").is_file()
    assert (tmp_path / "docs-trainers.md" / "ckpt" / "step_400" / "hf-tv" / "model-mtp.safetensors").is_file()
    assert (tmp_path / "docs-export.md" / "native-head").is_dir()


@pytest.mark.slow
def test_torchrun_block_runs_as_written(tmp_path, monkeypatch):
    """The README's data-parallel train-mtp: 2 gloo processes on CPU, with the walkthrough's settings."""
    monkeypatch.chdir(tmp_path)
    save_model_dir(tmp_path / TINY["MODEL"], tiny_model("qwen3", vocab_size=16))
    _text_rows(tmp_path / "rft.jsonl", 16, seed=0)
    block = find_block("README.md", "torchrun --nproc-per-node 2")
    assert run_shell_block(block, dict(TINY)) == []
    assert (tmp_path / "my-head-dp" / "model.safetensors").is_file()


# --------------------------------------------------------------------------------------------
# Blocks that are only parsed, and names that must match the package
# --------------------------------------------------------------------------------------------


class _FlagsParsed(Exception):
    """Raised in place of running a benchmark once its parser accepted the command's flags."""


def _bench_command(line: str) -> tuple[list[str], str, bool]:
    """(argv, target, is_module) of ``[VAR=value ...] .venv*/bin/python (bench/x.py | -m bench.x) ARGS``."""
    words = shlex.split(line, comments=True)
    while SETTING.match(words[0]):
        words = words[1:]
    assert re.fullmatch(r"\.venv(-vllm)?/bin/python", words[0]), line
    if words[1] == "-m":
        return [words[2].replace(".", "/") + ".py", *words[3:]], words[2], True
    return [words[1], *words[2:]], words[1], False


@pytest.mark.parametrize(("path", "start"), list(FLAGS_ONLY))
def test_benchmark_commands_parse(path, start, monkeypatch):
    """Each command of the block reaches the end of its script's argument parsing, and stops there."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, *args, **kwargs):
        original(self, *args, **kwargs)
        raise _FlagsParsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.chdir(REPO)
    for line in command_lines(find_block(path, start).body):
        argv, target, is_module = _bench_command(line)
        monkeypatch.setattr(sys, "argv", argv)
        with pytest.raises(_FlagsParsed):
            if is_module:
                runpy.run_module(target, run_name="__main__")
            else:
                runpy.run_path(str(REPO / target), run_name="__main__")


@pytest.mark.parametrize("script", ["gpu_smoke.sh", "gpu_headline.sh"])
def test_gpu_scripts_parse(script):
    done = subprocess.run(["bash", "-n", str(REPO / "bench" / script)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_install_lines_name_this_distribution_and_its_extras():
    """Every ``pip install`` of Bebop in the docs names the distribution and extras pyproject.toml defines."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["name"] == bebop.DISTRIBUTION
    assert importlib.metadata.version(bebop.DISTRIBUTION) == bebop.__version__  # the installed metadata agrees
    extras = set(project["optional-dependencies"])
    text = "\n".join(path.read_text() for path in DOC_FILES)
    assert not re.search(r"\bbebop\[", text), "the registry's `bebop` is another project: name bebop-rl"
    installs = re.findall(r"pip install[^`\n]*?'([\w.-]*)\[([\w,]+)\]", text)
    assert {name for name, _ in installs} == {".", bebop.DISTRIBUTION}, installs
    for _, named in installs:
        assert set(named.split(",")) <= extras, named


def test_grpo_config_table_names_exist():
    """docs/trainers.md's table: every `bebop rl` flag exists, every TRL name is a GRPOConfig field or a
    ``bebop_rollout_func`` argument."""
    pytest.importorskip("trl")
    import dataclasses

    from trl import GRPOConfig

    from bebop.integrations.trl import bebop_rollout_func

    text = (REPO / "docs" / "trainers.md").read_text()
    section = text[text.index("## `bebop rl`'s flags in TRL's GRPOConfig"):]
    section = section[:section.index("\n## ")]
    rows = [line.split(" | ") for line in section.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 15
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    rollout_args = set(inspect.signature(bebop_rollout_func).parameters)
    help_text = _rl_help()
    for flag in re.findall(r"`(--[a-z-]+)`", section):
        assert re.search(rf"{flag}\b", help_text), flag
    for _, trl_cell, _ in rows:
        for name in re.findall(r"`([a-z_0-9]+)", trl_cell):
            if name == "bebop_rollout_func":
                call = re.search(r"bebop_rollout_func\(([^)]*)\)", trl_cell).group(1)
                assert {a.strip(" =") for a in call.split(",")} <= rollout_args, call
            else:
                assert name in fields, f"{name} is not a field of TRL's GRPOConfig"


def _rl_help() -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["rl", "--help"])
    return out.getvalue()
