"""Step logs: one JSON object per line, appended as a run goes and cut back to its checkpoint on resume."""

from __future__ import annotations

import json
import os
from pathlib import Path

from bebop.utils.files import atomic_write_text, no_space_left, read_jsonl


def log_rows_until(path: str | os.PathLike, step: int, what: str = "log") -> list[dict]:
    """The rows of a step log (JSONL, a ``step`` per row) that a run resumed at ``step`` keeps.

    A torn last line is dropped, and so is every row past ``step`` (logged after the checkpoint
    the run resumes from), so the kept rows are those of a run that never stopped. A missing file
    gives no rows; a corrupt line before the last one raises BebopError.
    """
    path = Path(path)
    if not path.is_file():
        return []
    return [r for r in read_jsonl(path, what=what, torn_tail_ok=True) if r.get("step", 0) <= step]


class JsonlLogger:
    """Appends one JSON object per line and flushes, so a killed run keeps every finished step."""

    def __init__(self, path: str | os.PathLike, rows: list[dict] = ()) -> None:
        """Opens ``path`` holding exactly ``rows`` (a resumed run's ``log_rows_until``; none when fresh)."""
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in rows))
        self._f = open(self.path, "a")

    def log(self, row: dict) -> None:
        with no_space_left(self.path):  # NOTE: a torn last line is what resume drops (``log_rows_until``)
            self._f.write(json.dumps(row) + "\n")
            self._f.flush()

    def close(self) -> None:
        with no_space_left(self.path):  # NOTE: the file is closed even when its last flush fails
            self._f.close()


class NullLogger:
    """Stands in for a ``JsonlLogger`` where nothing is recorded (no drafts; a rank other than 0)."""

    def log(self, row: dict) -> None:
        pass

    def close(self) -> None:
        pass
