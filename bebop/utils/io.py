"""Atomic file and directory writes, locks, output-directory rules, JSONL metrics and clear errors.

Output directories follow one rule (``output_dir``: ``check_output_dir``, ``output_lock``,
``prepare_output_dir``): a non-empty directory is written into only to resume it, or after moving
it aside to ``NAME.old-<timestamp>`` (overwrite); nothing is ever deleted to make room; an output
is never an input or inside one; one command at a time writes it. A full device while writing ends
in one line naming the file (``no_space_left``), with the previous contents intact.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import sys
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


def _lock_file(path: Path) -> Path:
    """``.NAME.pid`` beside ``path``: the pid of the command writing ``path``, locked while it runs.

    ``path`` is resolved first, so two spellings of one directory (``run``, ``./x/../run``, a link) share a lock.
    """
    path = path.resolve()
    return path.with_name(f".{path.name}.pid")


def _busy(path: Path, holder: str, what: str) -> str:
    return (f"{what} {path} is being written by another bebop command (pid {holder or 'unknown'}); wait for it "
            "to end or choose another --out")


def lock_holder(path: str | os.PathLike) -> str | None:
    """The pid (as written; "" if not yet) of the command holding ``output_lock(path)``, or None; creates nothing."""
    lock = _lock_file(Path(path))
    if fcntl is None or not lock.is_file():
        return None
    try:
        fd = os.open(lock, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:  # NOTE: a link planted there is refused by output_lock
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # NOTE: released at once by the close below
        return None
    except BlockingIOError:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:  # no locks on this file system
        return None
    finally:
        os.close(fd)


@contextlib.contextmanager
def output_lock(path: str | os.PathLike, what: str = "output directory") -> Iterator[None]:
    """Holds ``.NAME.pid`` beside ``path`` for the block, so one command at a time writes (or moves) ``path``.

    Never waits: when another process holds it, raises BebopError naming that process's pid. The
    lock is on the path, not the directory, so it also covers moving the old directory aside. The
    file is removed on release; a killed holder leaves it, unlocked, and the next command takes it.
    The pid is written only into a regular file of one link: a symlink, a hard link or a directory
    planted at the lock's path is refused (``_open_lock``), so no other file is ever written.
    """
    lock = _lock_file(Path(path))
    if fcntl is None:
        yield
        return
    lock.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = _open_lock(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
            os.close(fd)
            raise BebopError(_busy(Path(path), holder, what)) from None
        except OSError:  # NOTE: e.g. ENOLCK on some network file systems: run unlocked
            break
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        os.close(fd)  # NOTE: the holder removed the file between our open and lock: take the new one
    try:
        with contextlib.suppress(OSError):  # NOTE: the pid only informs; on a full device the lock still holds
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)  # NOTE: while still locked, so a waiter that locked the old file sees it gone
        os.close(fd)


def _planted_lock(lock: Path, fd: int | None = None) -> str | None:
    """Why the file at a lock's path is not one bebop wrote (a symbolic link, a directory, a hard link to
    another file), or None; ``fd``: the file, opened without following links."""
    info = os.fstat(fd) if fd is not None else os.lstat(lock) if os.path.lexists(lock) else None
    kind = None if info is None else "a symbolic link" if stat.S_ISLNK(info.st_mode) else \
        "a directory" if stat.S_ISDIR(info.st_mode) else "a hard link to another file" if info.st_nlink > 1 else None
    return f"lock file {lock} is {kind}, not a lock file bebop wrote; remove it" if kind else None


def _open_lock(lock: Path) -> int:
    """A descriptor of the lock file ``lock``, created if missing, never through a link (``_planted_lock``)."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError:
        if problem := _planted_lock(lock):
            raise BebopError(problem) from None
        raise
    if problem := _planted_lock(lock, fd):
        os.close(fd)
        raise BebopError(problem)
    return fd


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
    if not _writable(base):
        raise BebopError(f"{what} {path}: cannot write in {base}")


def _writable(directory: Path) -> bool:
    """Whether a file can be created in ``directory``, tried with a temporary file (removed at once):
    permission bits do not tell for root, a read-only mount or /proc."""
    try:
        fd, name = tempfile.mkstemp(prefix=".bebop-write-test-", dir=directory)
    except OSError:
        return False
    os.close(fd)
    os.unlink(name)
    return True


def check_output_file(path: str | os.PathLike, what: str = "output file", others: dict | None = None) -> None:
    """Raises BebopError unless ``path`` can be written as a file; creates and changes nothing.

    ``others`` (description -> path, None entries skipped): the files and directories the command
    reads or writes besides; ``path`` must be none of them (a hard link or symlink to one included)
    and lie in none of them, or writing it would destroy what the command reads or writes.

    Example: check_output_file("ok.jsonl", "--json file", {"--data file": "ok.jsonl"}) raises
    "--json file ok.jsonl is the --data file ok.jsonl: the command would write over it".
    """
    path = Path(path)
    if path.is_dir():
        raise BebopError(f"{what} {path} is a directory")
    out = path.resolve()
    for name, given in (others or {}).items():
        if given is None or given == "":
            continue
        other = Path(given).resolve()
        same = out == other or (out.exists() and other.exists() and os.path.samefile(out, other))
        relation = "is" if same else "lies inside" if out.is_relative_to(other) else ""
        if relation:
            raise BebopError(f"{what} {path} {relation} the {name} {given}: the command would write over it")
    _check_writable_parent(path, what)


def check_output_dir(
    path: str | os.PathLike, resume: bool | None = None, overwrite: bool = False, what: str = "output directory",
    inputs: tuple = (), locked: bool = False,
) -> None:
    """Raises BebopError unless ``path`` may be written as an output directory; changes nothing.

    A missing or empty directory is fine. A non-empty one is refused unless ``resume`` (continue
    what it holds) or ``overwrite`` (``prepare_output_dir`` moves it aside first); ``resume`` None
    (the default) is a command without --resume, whose refusal does not suggest one. Also refused:
    a ``path`` that another command is writing (``output_lock``), and one that is, contains or lies
    inside one of ``inputs`` (paths the command reads; None entries are skipped). ``locked``: the
    caller holds ``output_lock(path)`` itself.
    """
    path = Path(path)
    if resume and overwrite:
        raise BebopError("--resume and --overwrite exclude each other")
    _check_apart(path, inputs, what)
    if problem := _planted_lock(_lock_file(path)):
        raise BebopError(problem)
    holder = None if locked else lock_holder(path)
    if holder is not None:
        raise BebopError(_busy(path, holder, what))
    if path.exists() and not path.is_dir():
        raise BebopError(f"{what} {path} is a file, not a directory")
    if path.is_dir():
        if not _writable(path):
            raise BebopError(f"{what} {path}: cannot write in it")
        if not resume and not overwrite and any(path.iterdir()):
            resumable = "--resume to continue it or " if resume is not None else ""  # NOTE: None: no --resume
            raise BebopError(f"{what} {path} is not empty; give {resumable}--overwrite to move "
                             f"it aside to {path.name}.old-<timestamp>")
    else:
        _check_writable_parent(path, what)


def _check_apart(path: Path, inputs: tuple, what: str) -> None:
    """An output must not be an input, hold one, or lie in one: writing it would change what is read."""
    out = path.resolve()
    for given in inputs:
        if given is None:
            continue
        source = Path(given).resolve()
        relation = "is" if out == source else "contains" if source.is_relative_to(out) else \
            "lies inside" if out.is_relative_to(source) else ""
        if relation:
            raise BebopError(f"{what} {path} {relation} the input {given}; choose another --out")


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

    Refused while another command holds ``output_lock(path)``; the lock is held only for this call
    (``output_dir`` holds it for a whole write).

    Args:
        path: the output directory.
        overwrite: move an existing non-empty ``path`` to ``NAME.old-<timestamp>`` first.
        announce: called with one line naming where the old directory went (default: stderr).

    Returns:
        Where the old directory was moved, or None.
    """
    with output_lock(path):
        return _prepare(Path(path), overwrite, announce)


def _prepare(path: Path, overwrite: bool, announce) -> Path | None:
    old = None
    if overwrite and path.is_dir() and any(path.iterdir()):
        old = move_aside(path)
        (announce or _stderr)(f"bebop: moved the existing {path} aside to {old}")
    path.mkdir(parents=True, exist_ok=True)
    return old


def any_file(path: Path) -> bool:
    """Whether directory ``path`` holds anything (``output_dir``'s default test of what a failed command leaves)."""
    return any(path.iterdir())


@contextlib.contextmanager
def output_dir(
    path: str | os.PathLike, resume: bool | None = None, overwrite: bool = False, what: str = "output directory",
    inputs: tuple = (), announce=None, worth_keeping=any_file,
) -> Iterator[Path]:
    """The one way a command takes its output directory: checked, locked, prepared, and put back on failure.

    Checks ``path`` (``check_output_dir``), holds ``output_lock`` for the block (no other command
    writes or moves it meanwhile), moves a non-empty one aside with ``overwrite`` and creates it
    (``prepare_output_dir``). If the block raises, a directory it created is removed unless
    ``worth_keeping(path)`` (default: it holds anything; a trainer passes "holds a checkpoint"), and
    the one it moved aside is put back: a failed command leaves ``path`` as it found it. A
    directory that existed (a resume) is never removed. Yields ``path``.
    """
    path = Path(path)
    check_output_dir(path, resume=resume, overwrite=overwrite, what=what, inputs=inputs)
    with output_lock(path, what):
        check_output_dir(path, resume=resume, overwrite=overwrite, what=what, inputs=inputs, locked=True)
        existed = path.is_dir()
        with no_space_left(path):
            old = _prepare(path, overwrite, announce)
        try:
            yield path
        except BaseException:
            if (old is not None or not existed) and path.is_dir() and not worth_keeping(path):
                shutil.rmtree(path)
                if old is not None:
                    os.rename(old, path)
                    (announce or _stderr)(f"bebop: moved {old} back to {path}")
            raise


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)  # a full device or a full quota: the same remedy
DISK_FULL_WORDS = ("No space left on device", "Disk quota exceeded", "os error 28", "os error 122")  # as
# writers without an errno word it (safetensors' Rust writer: "I/O error: No space left on device (os error 28)")


def is_disk_full(error: BaseException) -> bool:
    """Whether ``error``, or an exception it was raised from or while handling, is a full device.

    Example: torch.save into a Python file raises RuntimeError("... unexpected pos ...") whose
    ``__context__`` is the file's OSError(28): True.
    """
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in DISK_FULL_ERRNOS:
            return True
        if any(word in str(error) for word in DISK_FULL_WORDS):
            return True
        error = error.__cause__ or error.__context__
    return False


@contextlib.contextmanager
def no_space_left(path: str | os.PathLike) -> Iterator[None]:
    """Turns a full device inside the block into one BebopError line naming ``path``; other errors pass."""
    try:
        yield
    except BebopError:
        raise
    except Exception as e:
        if not is_disk_full(e):
            raise
        raise BebopError(f"no space left on the device while writing {path}") from e


def save_torch(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` through a Python file: a full device then raises OSError(ENOSPC), which
    ``no_space_left`` names, where torch's own file writer says only "basic_ios::clear"."""
    import torch

    with open(path, "wb") as f:
        torch.save(obj, f)


def _stderr(line: str) -> None:
    from bebop.utils.progress import say

    say(line)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary directory beside ``final``; on success it replaces ``final`` in one rename.

    Nothing is left half-written: an exception removes the temporary directory and keeps any
    previous ``final`` intact (a full device is one BebopError line, ``no_space_left``). Concurrent
    writers are safe: the last swap wins, nothing is left over.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with no_space_left(final):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        with no_space_left(final):
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
    except BebopError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if str(tmp) not in str(e):
            raise
        raise BebopError(str(e).replace(str(tmp), str(final))) from e  # NOTE: name the file the user asked for
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Writes ``text`` to ``path`` through a temporary file and a rename (a full device: ``no_space_left``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with no_space_left(path):
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with no_space_left(path), os.fdopen(fd, "w") as f:
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


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The UTF-8 text of an input file; BebopError naming it (and the byte) when it is not UTF-8."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        line = Path(path).read_bytes()[:e.start].count(b"\n") + 1
        raise BebopError(f"{what} {path} is not UTF-8 text: line {line} has byte 0x{e.object[e.start]:02x}; "
                         "save it as UTF-8") from None


def parse_json(text: str, where: str) -> Any:
    """``json.loads(text)``; BebopError naming ``where`` when the text is not JSON, or is nested deeper
    than Python's parser recurses (a received file can hold thousands of nested brackets)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BebopError(f"{where} is not valid JSON: {e}") from None
    except RecursionError:
        raise BebopError(f"{where} is not valid JSON here: it nests arrays or objects deeper than "
                         f"{sys.getrecursionlimit()} levels") from None


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    """Reads a JSON file, raising BebopError with one clear line when missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise BebopError(f"{what} not found: {path}")
    return parse_json(read_text(path, what), f"{what} {path}")


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
    lines = read_text(path, what).splitlines()
    last = max((i for i, line in enumerate(lines, start=1) if line.strip()), default=0)
    rows = []
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = parse_json(line, f"{what} {path} line {i}")
        except BebopError:
            if torn_tail_ok and i == last:
                break
            raise
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
