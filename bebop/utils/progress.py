"""Progress bars with ETA (tqdm), and fixed-format per-step lines."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def progress(items: Iterable[T], total: int | None = None, desc: str = "", enabled: bool = True) -> Iterator[T]:
    """Wraps ``items`` in a tqdm bar (to stderr) showing rate and ETA; a plain iterator when disabled or on a
    rank other than 0 under torchrun."""
    if not enabled or not _is_main():
        yield from items
        return
    # NOTE: in a log file (not a terminal) redraw at most every 30 s; the per-step lines carry the detail.
    interval = 0.1 if sys.stderr.isatty() else 30.0
    yield from tqdm(items, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False,
                    mininterval=interval)


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
