"""docs/trainers.md against the code it names: TRL's fields and vLLM's speculative config (when vLLM is here)."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import typing
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "trainers.md"
SPEC_CONFIG = re.compile(r"'(\{\"method\": \"mtp\"[^']*\})'|(\{\"method\": \"mtp\"[^`]*\})")


def _speculative_configs() -> list[dict]:
    found = [json.loads(a or b) for a, b in SPEC_CONFIG.findall(DOC.read_text())]
    assert found, "docs/trainers.md quotes no vLLM speculative config"
    return found


def test_trl_snippet_and_fields_exist():
    pytest.importorskip("trl")
    from trl import GRPOConfig
    from trl.scripts.vllm_serve import ScriptArguments

    from bebop.integrations.trl import bebop_rollout_func

    text = DOC.read_text()
    snippet = text.split("## Use it from TRL")[1].split("```python")[1].split("```")[0]
    calls = [n for n in ast.walk(ast.parse(snippet)) if isinstance(n, ast.Call)
             and getattr(n.func, "id", None) == "bebop_rollout_func"]
    assert len(calls) == 1 and len(snippet.strip().splitlines()) <= 5
    args = [ast.literal_eval(a) for a in calls[0].args]
    kwargs = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}
    assert bebop_rollout_func(*args, **kwargs).spec.mode == "rs"
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    for name in ("off_policy_mask_threshold", "generation_kwargs", "use_vllm", "use_cpu"):
        assert name in fields and f"`{name}" in text
    assert "speculative_config" in {f.name for f in dataclasses.fields(ScriptArguments)}


def test_vllm_speculative_configs_validate():
    """The doc's speculative configs name fields and values of vLLM's SpeculativeConfig (in vLLM's venv only)."""
    speculative = pytest.importorskip("vllm.config.speculative")
    fields = {f.name for f in dataclasses.fields(speculative.SpeculativeConfig)}
    for config in _speculative_configs():
        assert set(config) <= fields
        assert config["method"] in typing.get_args(speculative.MTPModelTypes)
        assert config["draft_sample_method"] in typing.get_args(speculative.DraftSampleMethod)


def test_every_trl_snippet_saves_the_state_bebop_report_reads():
    """TRL writes trainer_state.json only with a checkpoint: every documented TRL training, and the example
    script, saves it after training, so `bebop report` on its output directory finds the log history."""
    from tests.helpers.doc_blocks import DOC_FILES, fenced_blocks

    trains = [b for path in DOC_FILES for b in fenced_blocks(path) if b.language == "python" and ".train()" in b.body]
    assert len(trains) >= 2  # README's "Your trainer" and docs/trainers.md's "Use it from TRL"
    for block in trains:
        lines = [line.split("#")[0].strip() for line in block.body.splitlines()]
        assert "trainer.save_state()" in lines[lines.index("trainer.train()"):], f"{block.path}:{block.line}"
    example = (DOC.parents[1] / "examples" / "trl_grpo.py").read_text()
    assert re.search(r"^\s+trainer\.save_state\(\)", example, flags=re.M)
