"""Progress bars with ETA (tqdm) on a terminal, progress lines in a log file, and fixed-format per-step lines."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
LOG_PROGRESS_SECONDS = 30.0  # in a log file, one progress line at most this often


def progress(items: Iterable[T], total: int | None = None, desc: str = "", enabled: bool = True) -> Iterator[T]:
    """Wraps ``items`` in a tqdm bar (to stderr) showing rate and ETA; a plain iterator when disabled or on a
    rank other than 0 under torchrun. When stderr is not a terminal (a log file) no bar is drawn: a bar
    redrawn in a file leaves a stale copy before every log line, so a whole line with the count, rate
    and ETA is written instead, at most every LOG_PROGRESS_SECONDS."""
    if not enabled or not _is_main():
        yield from items
        return
    if not sys.stderr.isatty():
        yield from _progress_lines(items, total, desc)
        return
    yield from tqdm(items, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False)


def _progress_lines(items: Iterable[T], total: int | None, desc: str) -> Iterator[T]:
    start = last = time.monotonic()
    for done, item in enumerate(items, start=1):
        yield item
        now = time.monotonic()
        if now - last >= LOG_PROGRESS_SECONDS:
            last = now
            say(progress_line(desc, done, total, now - start))


def progress_line(desc: str, done: int, total: int | None, elapsed: float) -> str:
    """One line of progress for a log file.

    Example: progress_line("rl rs", 10, 40, 60.0) -> "rl rs: 10/40 (25%), 60 s, 0.167 it/s, about 180 s left".
    """
    rate = done / elapsed if elapsed > 0 else 0.0
    if total is None:
        return f"{desc}: {done}, {elapsed:.0f} s, {rate:.3g} it/s"
    left = f", about {(total - done) / rate:.0f} s left" if rate > 0 else ""
    return f"{desc}: {done}/{total} ({done / total:.0%}), {elapsed:.0f} s, {rate:.3g} it/s{left}"


def step_line(prefix: str, step: int, total: int, values: dict[str, float]) -> str:
    """One fixed-format line per step, e.g. ``train-mtp step   10/100 | loss 0.4123 | lr 3.0e-04``."""
    width = len(str(total))
    parts = [f"{prefix} step {step:>{width}}/{total}"]
    for key, value in values.items():
        parts.append(f"{key} {value:.4g}" if isinstance(value, float) else f"{key} {value}")
    return " | ".join(parts)


def say(line: str) -> None:
    """Prints a log line to stderr, clear of any progress bar (under torchrun, on rank 0 only)."""
    if not _is_main():
        return
    tqdm.write(line, file=sys.stderr)


def _is_main() -> bool:
    from bebop.utils.distributed import is_main

    return is_main()
