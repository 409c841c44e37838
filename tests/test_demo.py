"""Smoke test of ``bebop demo --quick``: the report and every plot exist and are non-empty.

It runs the whole pipeline on smoke-test budgets (a short pretrain in an isolated cache, tiny
heads, 3 RL steps per run), so it checks wiring, not findings. Marked slow; it still runs in CI.
"""

from __future__ import annotations

import re

import pytest

from bebop.cli import main


@pytest.mark.slow
def test_demo_quick(tmp_path):
    out = tmp_path / "demo"
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    report = out / "report.md"
    assert report.is_file() and report.stat().st_size > 0
    text = report.read_text()
    assert text.index("## The answer") < text.index("## The paper's findings") < text.index("## Details")
    for label in ("none", "to+ce", "rs+ce", "rs+e2e_tv", "rs+e2e_tv+online-ce"):
        assert label in text
    images = re.findall(r"\]\(([^)]+\.png)\)", text)
    assert len(images) >= 5
    for name in images:
        png = out / name
        assert png.is_file() and png.stat().st_size > 1000, name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second run reuses everything that finished and rewrites the same report.
    assert main(["demo", "--quick", "--out", str(out)]) == 0
