"""Locks: who may write a path now.

``file_lock`` waits for an exclusive advisory lock (a cache entry: ``entry_lock``; a directory being
swapped: ``bebop.utils.files.atomic_dir``); ``output_lock`` never waits, and refuses with the pid of the
command that holds it, so one command at a time writes an output directory
(``bebop.utils.outputs.output_dir``). Where the file system has no locks, both run unlocked.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from bebop.utils.errors import BebopError

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


def check_output_lock(path: str | os.PathLike, what: str = "output directory", held: bool = False) -> None:
    """Raises BebopError when ``output_lock(path)`` is refused: a file planted at the lock's path
    (``_planted_lock``), or another command holding it (skipped when the caller ``held`` it); creates nothing."""
    path = Path(path)
    if problem := _planted_lock(_lock_file(path)):
        raise BebopError(problem)
    holder = None if held else lock_holder(path)
    if holder is not None:
        raise BebopError(_busy(path, holder, what))


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
