"""Progress bars with ETA (tqdm) on a terminal, progress lines in a log file, stages that announce
themselves, and fixed-format per-step lines.

No long piece of work is silent for a minute: in a log file a loop's progress line comes every
``LOG_PROGRESS_SECONDS`` from a timer, also while one item takes longer than that; a stage that is no
loop (``stage``) says when it starts and ends and, while it runs, how long it has been running.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")
LOG_PROGRESS_SECONDS = 30.0  # in a log file, a loop's progress line this often; a running stage's line too


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
    """``items``, with a ``progress_line`` every LOG_PROGRESS_SECONDS (``ticking``) until the loop ends."""
    start, done = time.monotonic(), 0
    with ticking(lambda: progress_line(desc, done, total, time.monotonic() - start), LOG_PROGRESS_SECONDS):
        for item in items:
            yield item
            done += 1


@contextlib.contextmanager
def ticking(line: Callable[[], str], every: float) -> Iterator[None]:
    """Says ``line()`` every ``every`` seconds from a daemon thread while the block runs, so a step of the block
    that takes minutes still shows the work is alive (the main thread cannot print in the middle of it)."""
    stop = threading.Event()

    def tick() -> None:
        while not stop.wait(every):
            say(line())

    thread = threading.Thread(target=tick, name="bebop-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextlib.contextmanager
def stage(desc: str, total: int | None = None) -> Iterator[Callable[[str], None]]:
    """A stage of a long command announced in lines: ``desc ...`` at its start, ``desc: done in 12 s`` at its end,
    and while it runs, every LOG_PROGRESS_SECONDS, its running time and the part it is on. Yields ``advance``:
    ``advance("ce head at T=0.5")`` starts the next of ``total`` parts and names it.

    Example (a log file, one part taking 70 s):
        demo: temperature sweep (12 evaluations) ...
        demo: temperature sweep: 30 s, on 1/12 (ce head at T=0.1)
        demo: temperature sweep: 60 s, on 1/12 (ce head at T=0.1)
        ...
        demo: temperature sweep: done in 840 s
    """
    start, part = time.monotonic(), [0, ""]  # (parts started, the current part's name)

    def advance(what: str = "") -> None:
        part[:] = [part[0] + 1, what]

    def running() -> str:
        of = f"/{total}" if total else ""
        on = f", on {part[0]}{of}" + (f" ({part[1]})" if part[1] else "") if part[0] else ""
        return f"{desc}: {time.monotonic() - start:.0f} s{on}"

    say(f"{desc} ...")
    with ticking(running, LOG_PROGRESS_SECONDS):
        yield advance
    say(f"{desc}: done in {time.monotonic() - start:.0f} s")


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
