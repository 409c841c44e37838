"""Files written whole or not at all, and read with one-line errors.

A write goes to a temporary file or directory beside its target and replaces it in one rename
(``atomic_dir``, ``atomic_write_text``, ``write_json``), so a failed write leaves the previous contents
intact; a full device while writing ends in one line naming the file (``no_space_left``). What is
written gets the modes a plain ``open``/``mkdir`` gives under the process's umask (``shared_mode``), not
the private 0600/0700 of a temporary file or directory, so a server running as another user can read
a model directory Bebop wrote. A reader
(``read_text``, ``read_json``, ``read_jsonl``) names the file, and the line or byte, that is missing,
not UTF-8 or not JSON.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bebop.utils.errors import BebopError
from bebop.utils.locks import file_lock


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


def umask() -> int:
    """The process's umask. Read from /proc where Linux shows it: setting it to read it back (the only
    portable way, used elsewhere) would leave another thread creating files under a wrong umask meanwhile."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shared_mode(directory: bool = False) -> int:
    """The mode ``open`` (0666) or ``mkdir`` (0777) gives under the umask, e.g. 0644 and 0755 under umask 022."""
    return (0o777 if directory else 0o666) & ~umask()


def share_tree(root: Path) -> None:
    """Gives ``root`` and every folder and regular file under it ``shared_mode``: temporary directories are made
    0700, and some writers (safetensors' ``save_file``, ``mkstemp``) create their files 0600. Symbolic links
    are left alone (a chmod would follow them)."""
    file_mode, dir_mode = shared_mode(False), shared_mode(True)
    os.chmod(root, dir_mode)
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, dir_mode if name in dirs else file_mode)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike) -> Iterator[Path]:
    """Yields a temporary directory beside ``final``; on success it replaces ``final`` in one rename.

    Nothing is left half-written: an exception removes the temporary directory and keeps any
    previous ``final`` intact (a full device is one BebopError line, ``no_space_left``). Concurrent
    writers are safe: the last swap wins, nothing is left over. ``final`` and what it holds get
    ``shared_mode`` (``share_tree``).
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with no_space_left(final):
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        with no_space_left(final):
            yield tmp
        share_tree(tmp)
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
        os.chmod(tmp, shared_mode())  # NOTE: mkstemp makes 0600; results are meant to be shared
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Atomically writes ``obj`` as indented JSON."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def check_input_file(path: str | os.PathLike, what: str = "file") -> Path:
    """``path`` (``~`` expanded) when it names a regular file; BebopError saying what it is otherwise.

    A directory, a pipe, a device or standard input (``/dev/stdin`` on a terminal or a pipe) is
    refused as such rather than as "not found": every input is read whole and checked before
    anything is written, which a stream does not allow.

    Example: check_input_file("/dev/stdin", "prompts file") on a terminal raises "prompts file
    /dev/stdin is not a regular file (a pipe, a device or standard input): save it to a file and give that".
    """
    file = Path(path).expanduser()
    if file.is_file():
        return file
    if file.is_dir():
        raise BebopError(f"{what} {path} is a directory, not a file")
    if file.exists():
        raise BebopError(f"{what} {path} is not a regular file (a pipe, a device or standard input): save it to a "
                         "file and give that")
    raise BebopError(f"{what} not found: {path}")


def read_text(path: str | os.PathLike, what: str = "file") -> str:
    """The UTF-8 text of an input file (``check_input_file``), without a byte-order mark (an editor's
    marker, never text); BebopError naming it (and the byte) when it is not UTF-8."""
    check_input_file(path, what)
    try:
        return Path(path).expanduser().read_text(encoding="utf-8-sig")
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
    path = check_input_file(path, what)
    return parse_json(read_text(path, what), f"{what} {path}")


def read_jsonl(path: str | os.PathLike, what: str = "file", torn_tail_ok: bool = False) -> list[dict]:
    """Reads a JSONL file (one object per line; blank lines skipped) with line-numbered errors.

    Args:
        path: the file.
        what: its name in error messages.
        torn_tail_ok: drop an unparsable *last* line (an append cut short by a kill or a full
            disk) instead of raising; an unparsable line anywhere else is still an error.
    """
    path = check_input_file(path, what)
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
