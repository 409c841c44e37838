"""Atomic file and directory writes, JSONL metrics and clear errors for bad input files."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class BebopError(Exception):
    """An error caused by user input (a file, a flag, a config): the CLI prints one line and exits 2."""


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary directory beside ``final``; on success it replaces ``final`` in one rename.

    Nothing is left half-written: an exception removes the temporary directory and keeps any
    previous ``final`` intact.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        old = None
        if final.exists():
            old = final.with_name(f".{final.name}.old-{os.getpid()}")
            os.replace(final, old)
        os.replace(tmp, final)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically writes ``obj`` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Reads a JSON file, raising BebopError with one clear line when missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise BebopError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise BebopError(f"{what} {path} is not valid JSON: {e}") from None


def read_jsonl(path: str | os.PathLike, what: str = "file") -> list[dict]:
    """Reads a JSONL file (one object per line; blank lines skipped) with line-numbered errors."""
    path = Path(path)
    if not path.is_file():
        raise BebopError(f"{what} not found: {path}")
    rows = []
    for i, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BebopError(f"{what} {path} line {i} is not valid JSON: {e}") from None
        if not isinstance(row, dict):
            raise BebopError(f"{what} {path} line {i} is not a JSON object")
        rows.append(row)
    return rows


class JsonlLogger:
    """Appends one JSON object per line and flushes, so a killed run keeps every finished step."""

    def __init__(self, path: str | os.PathLike, truncate_after_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            # NOTE: on resume, drop lines logged after the checkpoint so the file matches a run that never stopped.
            keep = [r for r in read_jsonl(self.path) if r.get("step", 0) <= truncate_after_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in keep))
        self._f = open(self.path, "a")

    def log(self, row: dict) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()
