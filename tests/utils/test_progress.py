"""``bebop.utils.progress``: a bar on a terminal; in a log file whole progress lines and no stale bar."""

from __future__ import annotations

import io
import sys

from bebop.utils import progress


def test_a_log_file_gets_whole_lines_and_no_bar(monkeypatch):
    """Redrawn in a file, a bar left a copy of itself before every log line; a file gets progress lines only."""
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_PROGRESS_SECONDS", 0.0)
    for step in progress.progress(range(3), total=3, desc="rl rs"):
        progress.say(f"rl step {step + 1}/3 | loss 0.5")
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "|" not in "".join(line for line in lines if not line.startswith("rl step"))
    assert [line for line in lines if line.startswith("rl step")] == [f"rl step {i}/3 | loss 0.5" for i in (1, 2, 3)]
    assert [line.split(",")[0] for line in lines if not line.startswith("rl step")] == \
        ["rl rs: 1/3 (33%)", "rl rs: 2/3 (67%)", "rl rs: 3/3 (100%)"]


def test_progress_line():
    assert progress.progress_line("rl rs", 10, 40, 60.0) == "rl rs: 10/40 (25%), 60 s, 0.167 it/s, about 180 s left"
    assert progress.progress_line("generate", 5, None, 10.0) == "generate: 5, 10 s, 0.5 it/s"
