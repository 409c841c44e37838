"""``bebop.utils.progress``: a bar on a terminal; in a log file whole progress lines and no stale bar."""

from __future__ import annotations

import io
import re
import sys
import time

import pytest

from bebop.utils import progress


def test_a_log_file_gets_whole_lines_and_no_bar(monkeypatch):
    """Redrawn in a file, a bar left a copy of itself before every log line; a file gets progress lines only,
    from a timer, so an item longer than the interval still shows the loop is alive."""
    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_PROGRESS_SECONDS", 0.05)
    for step in progress.progress(range(2), total=2, desc="rl rs"):
        time.sleep(0.3)  # an item of six intervals
        progress.say(f"rl step {step + 1}/2 | loss 0.5")
    time.sleep(0.2)  # the loop has ended: no more lines
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and "|" not in "".join(line for line in lines if not line.startswith("rl step"))
    assert [line for line in lines if line.startswith("rl step")] == [f"rl step {i}/2 | loss 0.5" for i in (1, 2)]
    counts = [line.split(",")[0] for line in lines if not line.startswith("rl step")]
    assert counts.count("rl rs: 0/2 (0%)") >= 2 and counts.count("rl rs: 1/2 (50%)") >= 2  # during each item
    assert lines[-1] == "rl step 2/2 | loss 0.5"


def test_a_stage_announces_itself_and_says_it_is_alive(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_PROGRESS_SECONDS", 0.05)
    with progress.stage("demo: temperature sweep (2 evaluations)", total=2) as advance:
        advance("ce head at T=0.5")
        time.sleep(0.3)
    lines = log.getvalue().splitlines()
    assert lines[0] == "demo: temperature sweep (2 evaluations) ..."
    assert lines[-1] == "demo: temperature sweep (2 evaluations): done in 0 s"
    assert len(lines) >= 4 and all(re.fullmatch(r"demo: temperature sweep \(2 evaluations\): 0 s, on 1/2 \(ce head "
                                                r"at T=0\.5\)", line) for line in lines[1:-1])
    log.seek(0)
    log.truncate(0)
    with pytest.raises(RuntimeError), progress.stage("demo: report"):
        raise RuntimeError("failed")
    assert log.getvalue().strip().splitlines() == ["demo: report ..."]  # no "done" for a stage that failed


def test_progress_line():
    assert progress.progress_line("rl rs", 10, 40, 60.0) == "rl rs: 10/40 (25%), 60 s, 0.167 it/s, about 180 s left"
    assert progress.progress_line("generate", 5, None, 10.0) == "generate: 5, 10 s, 0.5 it/s"
