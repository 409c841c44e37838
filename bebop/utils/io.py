"""Atomic file and directory writes, locks, output-directory rules, JSONL metrics and clear errors.

Output directories follow one rule (``check_output_dir``, ``prepare_output_dir``): a non-empty
directory is written into only to resume it, or after moving it aside to ``NAME.old-<timestamp>``
(overwrite); nothing is ever deleted to make room.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bebop.utils.errors import BebopError  # noqa: F401 (re-exported: raise it from here)

try:
    import fcntl
except ImportError:  # not on POSIX: locks become no-ops
    fcntl = None


@contextlib.contextmanager
def file_lock(path: str | os.PathLike) -> Iterator[None]:
    """Holds an exclusive advisory lock (``fcntl.flock``) on ``path`` while the block runs.

    ``path`` is a directory, or a lock file that is created when missing (and left in place: a
    lock file cannot be removed safely while another process may be waiting on it). Where the
    file system has no locks, the block runs unlocked.
    """
    path = Path(path)
    if fcntl is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY) if path.is_dir() else os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        with contextlib.suppress(OSError):  # NOTE: e.g. ENOLCK on some network file systems
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def entry_lock(path: str | os.PathLike) -> contextlib.AbstractContextManager[None]:
    """The lock that serializes building the cache entry ``path``: ``.NAME.lock`` beside it."""
    path = Path(path)
    return file_lock(path.with_name(f".{path.name}.lock"))


def _nearest_existing(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _check_writable_parent(path: Path, what: str) -> None:
    """``path`` can be created: its nearest existing ancestor is a writable directory."""
    base = _nearest_existing(path.parent)
    if not base.is_dir():
        raise BebopError(f"{what} {path}: {base} is not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise BebopError(f"{what} {path}: cannot write in {base}")


def check_output_file(path: str | os.PathLike, what: str = "output file") -> None:
    """Raises BebopError unless ``path`` can be written as a file; creates and changes nothing."""
    path = Path(path)
    if path.is_dir():
        raise BebopError(f"{what} {path} is a directory")
    _check_writable_parent(path, what)


def check_output_dir(
    path: str | os.PathLike, resume: bool = False, overwrite: bool = False, what: str = "output directory"
) -> None:
    """Raises BebopError unless ``path`` may be written as an output directory; changes nothing.

    A missing or empty directory is fine. A non-empty one is refused unless ``resume`` (continue
    what it holds) or ``overwrite`` (``prepare_output_dir`` moves it aside first).
    """
    path = Path(path)
    if resume and overwrite:
        raise BebopError("--resume and --overwrite exclude each other")
    if path.exists() and not path.is_dir():
        raise BebopError(f"{what} {path} is a file, not a directory")
    if path.is_dir():
        if not os.access(path, os.W_OK | os.X_OK):
            raise BebopError(f"{what} {path}: cannot write in it")
        if not resume and not overwrite and any(path.iterdir()):
            raise BebopError(f"{what} {path} is not empty; give --resume to continue it or --overwrite to move "
                             f"it aside to {path.name}.old-<timestamp>")
    else:
        _check_writable_parent(path, what)


def move_aside(path: str | os.PathLike) -> Path:
    """Renames ``path`` to a sibling ``NAME.old-<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... if taken); returns it."""
    path = Path(path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for n in range(1, 1000):
        old = path.with_name(f"{path.name}.old-{stamp}" + (f"-{n}" if n > 1 else ""))
        if not old.exists():
            os.rename(path, old)
            return old
    raise BebopError(f"cannot move {path} aside: too many {path.name}.old-{stamp}* siblings")


def prepare_output_dir(path: str | os.PathLike, overwrite: bool = False, announce=None) -> Path | None:
    """Creates ``path`` after ``check_output_dir`` passed; with ``overwrite`` a non-empty one is moved aside.

    Args:
        path: the output directory.
        overwrite: move an existing non-empty ``path`` to ``NAME.old-<timestamp>`` first.
        announce: called with one line naming where the old directory went (default: stderr).

    Returns:
        Where the old directory was moved, or None.
    """
    path = Path(path)
    old = None
    if overwrite and path.is_dir() and any(path.iterdir()):
        old = move_aside(path)
        (announce or _stderr)(f"bebop: moved the existing {path} aside to {old}")
    path.mkdir(parents=True, exist_ok=True)
    return old


def _stderr(line: str) -> None:
    from bebop.utils.progress import say

    say(line)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary directory beside ``final``; on success it replaces ``final`` in one rename.

    Nothing is left half-written: an exception removes the temporary directory and keeps any
    previous ``final`` intact. Concurrent writers are safe: the last swap wins, nothing is left over.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        yield tmp
        old = None
        # NOTE: two renames are not one atomic step; the lock on the parent keeps two writers of
        # ``final`` from interleaving them (else "Directory not empty" and leftover .old- folders).
        with file_lock(final.parent):
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


def read_jsonl(path: str | os.PathLike, what: str = "file", torn_tail_ok: bool = False) -> list[dict]:
    """Reads a JSONL file (one object per line; blank lines skipped) with line-numbered errors.

    Args:
        path: the file.
        what: its name in error messages.
        torn_tail_ok: drop an unparsable *last* line (an append cut short by a kill or a full
            disk) instead of raising; an unparsable line anywhere else is still an error.
    """
    path = Path(path)
    if not path.is_file():
        raise BebopError(f"{what} not found: {path}")
    lines = path.read_text().splitlines()
    last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if torn_tail_ok and i == last:
                break
            raise BebopError(f"{what} {path} line {i} is not valid JSON: {e}") from None
        if not isinstance(row, dict):
            raise BebopError(f"{what} {path} line {i} is not a JSON object")
        rows.append(row)
    return rows


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
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


class NullLogger:
    """Stands in for a ``JsonlLogger`` where nothing is recorded (no drafts; a rank other than 0)."""

    def log(self, row: dict) -> None:
        pass

    def close(self) -> None:
        pass
