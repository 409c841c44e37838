"""examples/trl_grpo.py end to end on a barely-trained embedded model, and ``bebop report`` on its output."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

from bebop.cli import main as bebop_main  # noqa: E402
from tests.conftest import fill_tiny_cache  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo.py"


@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """The example's output directory after 2 GRPO steps (its own barely-trained cache)."""
    mp = pytest.MonkeyPatch()
    fill_tiny_cache(tmp_path_factory.mktemp("trl-cache"), mp)
    spec = importlib.util.spec_from_file_location("trl_grpo_example", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    out = tmp_path_factory.mktemp("trl-run") / "run"
    example.main(["--max-steps", "2", "--output-dir", str(out), "--prompts-per-step", "2", "--num-generations", "2",
                  "--max-completion-length", "12"])
    yield out
    mp.undo()


@pytest.mark.slow
def test_example_leaves_log_history_with_acceptance(example_run):
    state = json.loads((example_run / "trainer_state.json").read_text())
    steps = [r for r in state["log_history"] if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    assert all(1.0 <= r["spec/accept_length"] <= 4.0 and r["spec/target_entropy"] > 0 for r in steps)
    assert len((example_run / "token_stats.jsonl").read_text().splitlines()) == 2


@pytest.mark.slow
def test_report_reads_the_trl_output(example_run, tmp_path):
    """``bebop report`` on TRL's output directory: the run is placed as rs + e2e-TV, with token statistics."""
    out = tmp_path / "report"
    assert bebop_main(["report", str(example_run), "--out", str(out)]) == 0
    text = (out / "report.md").read_text()
    assert "trl:rs+e2e_tv" in text and "accept_vs_entropy.png" in text
    token_section = text.split("## Token level")[1].split("\n## ")[0]
    assert "| trl:rs+e2e_tv |" in token_section  # the token statistics Bebop left beside TRL's history
