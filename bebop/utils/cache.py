"""Bebop's cache directory: the embedded model, its heads and data (``bebop.embedded``), and the auto
chooser's profiles (``bebop.speculative.auto.profile``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "BEBOP_CACHE_DIR"  # overrides the default ~/.cache/bebop


def cache_dir() -> Path:
    """Where Bebop caches what it builds (``$BEBOP_CACHE_DIR`` or ``~/.cache/bebop``)."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "bebop"))
