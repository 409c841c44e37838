"""Where a command may write: output files and directories checked, locked, prepared and put back.

Output directories follow one rule (``output_dir``: ``check_output_dir``, ``output_lock``,
``prepare_output_dir``): a non-empty directory is written into only to resume it, or after moving
it aside to ``NAME.old-<timestamp>`` (overwrite); nothing is ever deleted to make room; an output
is never an input or inside one; one command at a time writes it (``bebop.utils.locks``). A full
device while preparing it ends in one line naming it (``bebop.utils.files.no_space_left``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from bebop.utils.errors import BebopError
from bebop.utils.files import no_space_left
from bebop.utils.locks import check_output_lock, output_lock


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
    check_output_lock(path, what, held=locked)
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


def _stderr(line: str) -> None:
    from bebop.utils.progress import say

    say(line)
