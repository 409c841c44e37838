"""``bebop demo`` is never silent: each stage announces itself, and while a part of it runs (an evaluation of
the temperature sweep took minutes on a loaded machine) a line says how long it has been running and which
part it is on. The stages' work is replaced by stubs that take several progress intervals each."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path

import bebop.demo as demo
from bebop.utils import progress

INTERVAL = 0.03  # LOG_PROGRESS_SECONDS in this test
PART_SECONDS = 5 * INTERVAL  # how long each stubbed part runs


class _TimedLog(io.StringIO):
    """A log file (not a terminal) that records when each line was written."""

    def __init__(self):
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.lines += [(time.monotonic(), line) for line in text.splitlines() if line]
        return super().write(text)


class _Model:
    device = "cpu"
    pad_token_id = 0  # it stands for the tokenizer too

    def to(self, *_):
        return self

    def eval(self):
        return self


def test_every_demo_stage_announces_itself_and_no_part_is_silent(tmp_path, monkeypatch):
    log, parts = _TimedLog(), []
    monkeypatch.setattr(sys, "stderr", log)
    monkeypatch.setattr(progress, "LOG_PROGRESS_SECONDS", INTERVAL)

    def slow(name, result):
        def part(*_, **__):
            start = time.monotonic()
            time.sleep(PART_SECONDS)
            parts.append((name, start, time.monotonic()))
            return result
        return part

    monkeypatch.setattr(demo, "_model_dir", slow("model", tmp_path))
    monkeypatch.setattr(demo.models, "load_model", slow("load", (_Model(), _Model())))
    monkeypatch.setattr(demo, "_data", slow("data", (None, None)))
    monkeypatch.setattr(demo, "_head", slow("head", tmp_path))
    monkeypatch.setattr(demo.MtpHead, "from_pretrained", lambda *_: _Model())
    monkeypatch.setattr(demo, "evaluate_mtp", slow("evaluate", {"temperature": 1.0}))
    monkeypatch.setattr(demo, "_rl_run", slow("rl", tmp_path))
    monkeypatch.setattr(demo, "_report", slow("report", tmp_path / "report.md"))
    cfg = demo.DemoConfig(out=str(tmp_path / "demo"), seeds=1, temperatures=(0.5, 1.0))
    assert demo.run_demo(cfg) == Path(tmp_path / "report.md")

    starts = [line for _, line in log.lines if line.endswith(" ...")]
    assert starts == ["demo: the embedded model ...", "demo: self-generated training and held-out data ...",
                      "demo: heads (5 draft losses) ...", "demo: exact acceptance of each head (5 evaluations) ...",
                      "demo: temperature sweep (4 evaluations) ...", "demo: RL runs (6 of 150 steps) ...",
                      "demo: report ..."]
    assert sum(line.endswith(" s") and ": done in " in line for _, line in log.lines) == len(starts)
    assert len(parts) == 2 + 1 + 5 + 5 + 4 + 6 + 1
    silent = [name for name, start, end in parts if not any(start < t < end for t, _ in log.lines)]
    assert not silent, f"parts that printed nothing while they ran: {silent}"
    assert "demo: temperature sweep (4 evaluations): 0 s, on 2/4 (ce head at T=1)" in [line for _, line in log.lines]
