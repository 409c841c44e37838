"""RL run directories as written by ``bebop rl``: loading and checking them.

A run directory holds ``config.json`` (the resolved config), ``metrics.jsonl`` (one object per RL
step) and optionally ``token_stats.jsonl`` (per kept draft position: depth j, completion row,
H(p), alpha_RS, alpha_TO). Bad files give one ``BebopError`` line naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bebop.utils.io import BebopError, read_json, read_jsonl

CONFIG_FILE = "config.json"  # resolved config of the run
METRICS_FILE = "metrics.jsonl"  # one JSON object per RL step
TOKEN_STATS_FILE = "token_stats.jsonl"  # optional per-position entropy and counterfactual acceptance
TOKEN_STATS_KEYS = ("position", "entropy", "alpha_rs", "alpha_to")  # flat lists, one entry per position
TOKEN_ROW_KEY = "row"  # optional flat list: the completion each position belongs to (older files lack it)


@dataclasses.dataclass(frozen=True)
class Run:
    """One RL run as read from its directory."""

    label: str  # short human label, e.g. "rs+e2e_tv"
    config: dict  # resolved config (config.json)
    metrics: list[dict]  # one dict per RL step, sorted by "step"
    token_stats: list[dict] | None  # rows of token_stats.jsonl, or None when the file is absent
    path: Path | None = None  # the run directory


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def run_label(config: Mapping[str, Any]) -> str:
    """Returns ``config["label"]`` or builds one from mode, head loss and update.

    Example:
        >>> run_label({"mode": "to", "mtp_loss": "ce", "mtp_update": "online", "online_loss": "ce"})
        'to+ce+online-ce'
    """
    if config.get("label"):
        return str(config["label"])
    mode = str(config.get("mode") or "none")
    if mode == "none":
        return "none"
    parts = [mode, str(config.get("mtp_loss") or "head")]
    if config.get("mtp_update") == "online":
        parts.append(f"online-{config.get('online_loss') or 'ce'}")
    return "+".join(parts)


def _check_metrics(rows: list[dict], path: Path) -> list[dict]:
    if not rows:
        raise BebopError(f"metrics {path} has no steps")
    for i, row in enumerate(rows, start=1):
        if not isinstance(row.get("step"), int) or isinstance(row.get("step"), bool):
            raise BebopError(f"metrics {path} row {i} has no integer 'step'")
    return sorted(rows, key=lambda r: r["step"])


def _check_token_stats(rows: list[dict], path: Path) -> list[dict]:
    for i, row in enumerate(rows, start=1):
        lists = [row.get(k) for k in TOKEN_STATS_KEYS]
        if not all(isinstance(v, list) for v in lists):
            raise BebopError(f"token stats {path} row {i} lacks one of the lists {', '.join(TOKEN_STATS_KEYS)}")
        if TOKEN_ROW_KEY in row:
            lists.append(row[TOKEN_ROW_KEY])
            if not isinstance(row[TOKEN_ROW_KEY], list):
                raise BebopError(f"token stats {path} row {i}: '{TOKEN_ROW_KEY}' is not a list")
        if len({len(v) for v in lists}) != 1:
            raise BebopError(f"token stats {path} row {i} has lists of different lengths")
    return rows


def load_run(run_dir: str | os.PathLike) -> Run:
    """Reads a run directory.

    Args:
        run_dir: Directory holding config.json, metrics.jsonl and optionally token_stats.jsonl.

    Returns:
        The run, metrics sorted by step.

    Raises:
        BebopError: With one line naming the file and the problem, when a file is missing,
            is not valid JSON, or lacks what the analysis needs.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BebopError(f"run directory not found: {run_dir}")
    config = read_json(run_dir / CONFIG_FILE, "run config")
    if not isinstance(config, dict):
        raise BebopError(f"run config {run_dir / CONFIG_FILE} is not a JSON object")
    metrics = _check_metrics(read_jsonl(run_dir / METRICS_FILE, "metrics"), run_dir / METRICS_FILE)
    stats_path = run_dir / TOKEN_STATS_FILE
    token_stats = None
    if stats_path.exists():
        token_stats = _check_token_stats(read_jsonl(stats_path, "token stats"), stats_path)
    return Run(run_label(config), config, metrics, token_stats, run_dir)


def as_float(value: Any) -> float:
    """Numbers as floats; None, booleans and anything else as NaN."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def metric_column(metrics: Sequence[Mapping], key: str) -> np.ndarray:
    """One scalar metric over steps, shape (S,), NaN where absent or null."""
    return np.array([as_float(row.get(key)) for row in metrics], dtype=float)
