"""RL run directories as written by ``bebop rl`` or by TRL with Bebop's rollouts: loading and checking them.

A run directory holds ``config.json`` (the resolved config), ``metrics.jsonl`` (one object per RL
step) and optionally ``token_stats.jsonl`` (per kept draft position: depth j, completion row,
H(p), alpha_RS, alpha_TO). Bad files give one ``BebopError`` line naming the file.

A TRL output directory (``GRPOTrainer`` with ``bebop.integrations.trl``) holds TRL's log history
instead (``trainer_state.json``, ``log_history.json`` or the newest ``checkpoint-N/trainer_state.json``),
optionally ``bebop_rollout.json`` and the same ``token_stats.jsonl``. Its rows become metrics rows
by ``TRL_KEYS`` (TRL's mean reward stands for accuracy), and the per-position ``spec/<name>/j`` keys
become the lists ``spec/<name>``.
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
from bebop.utils.progress import say

CONFIG_FILE = "config.json"  # resolved config of the run
METRICS_FILE = "metrics.jsonl"  # one JSON object per RL step
TOKEN_STATS_FILE = "token_stats.jsonl"  # optional per-position entropy and counterfactual acceptance
TOKEN_STATS_KEYS = ("position", "entropy", "alpha_rs", "alpha_to")  # flat lists, one entry per position
TOKEN_ROW_KEY = "row"  # optional flat list: the completion each position belongs to (older files lack it)
TRL_STATE_FILES = ("trainer_state.json", "log_history.json")  # TRL's log history: a state dict, or the bare list
TRL_ROLLOUT_FILE = "bebop_rollout.json"  # the rollout function's settings (bebop.integrations.trl)
TRL_KEYS = {"target_entropy": ("spec/target_entropy", "entropy"), "rollout_s": ("spec/rollout_seconds",),
            "step_s": ("step_time",), "accuracy": ("reward",)}  # metrics key <- first TRL key not null
TRL_PER_POSITION = ("spec/accepted_per_pos", "spec/alpha_rs", "spec/alpha_to")  # logged by TRL as "<key>/j"


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


def _read_log(path: Path, what: str) -> list[dict]:
    """A run's JSONL log; a torn last line (a run killed while appending) is dropped with a note, as
    ``bebop rl --resume`` drops it; a corrupt line elsewhere is an error."""
    try:
        return read_jsonl(path, what)
    except BebopError:
        rows = read_jsonl(path, what, torn_tail_ok=True)  # NOTE: raises again unless only the last line is torn
    say(f"bebop: note: {path}: left out its torn last line (a run stopped while writing it; --resume drops it too)")
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
    if not (run_dir / CONFIG_FILE).exists() and trl_state_file(run_dir) is not None:
        return load_trl_run(run_dir)
    config = read_json(run_dir / CONFIG_FILE, "run config")
    if not isinstance(config, dict):
        raise BebopError(f"run config {run_dir / CONFIG_FILE} is not a JSON object")
    metrics = _check_metrics(_read_log(run_dir / METRICS_FILE, "metrics"), run_dir / METRICS_FILE)
    stats_path = run_dir / TOKEN_STATS_FILE
    token_stats = None
    if stats_path.exists():
        token_stats = _check_token_stats(_read_log(stats_path, "token stats"), stats_path)
    return Run(run_label(config), config, metrics, token_stats, run_dir)


def trl_state_file(run_dir: Path) -> Path | None:
    """The file holding a TRL output directory's log history, or None when it has none."""
    for name in TRL_STATE_FILES:
        if (run_dir / name).is_file():
            return run_dir / name
    checkpoints = [p for p in run_dir.glob("checkpoint-*/trainer_state.json") if p.parent.name[11:].isdigit()]
    return max(checkpoints, key=lambda p: int(p.parent.name[11:]), default=None)


def trl_metrics_row(row: Mapping[str, Any]) -> dict:
    """One TRL log-history row as a metrics row (``TRL_KEYS``, per-position lists).

    Example: {"step": 3, "reward": 0.5, "spec/alpha_rs/1": 0.9, "spec/alpha_rs/2": 0.8}
        -> {..., "step": 3, "accuracy": 0.5, "spec/alpha_rs": [0.9, 0.8]}
    """
    out = dict(row)
    for key, sources in TRL_KEYS.items():
        out[key] = next((row[s] for s in sources if row.get(s) is not None), None)  # NOTE: TRL logs null for all-NaN
    for key in TRL_PER_POSITION:
        suffixes = [k[len(key) + 1:] for k in row if k.startswith(key + "/")]
        depths = sorted(int(j) for j in suffixes if j.isdigit())
        if depths:
            out[key] = [row.get(f"{key}/{j}") for j in range(1, depths[-1] + 1)]
    return out


def load_trl_run(run_dir: str | os.PathLike) -> Run:
    """Reads a TRL output directory (see the module docstring); BebopError (one line) on a bad file."""
    run_dir = Path(run_dir)
    path = trl_state_file(run_dir)
    if path is None:
        raise BebopError(f"{run_dir} holds no TRL log history ({', '.join(TRL_STATE_FILES)})")
    state = read_json(path, "TRL log history")
    history = state.get("log_history") if isinstance(state, dict) else state
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise BebopError(f"TRL log history {path} is not a list of objects")
    rows = [trl_metrics_row(r) for r in history if "step" in r and ("loss" in r or "spec/accept_length" in r)]
    metrics = _check_metrics(rows, path)
    rollout = {}
    if (run_dir / TRL_ROLLOUT_FILE).exists():
        rollout = read_json(run_dir / TRL_ROLLOUT_FILE, "Bebop rollout settings")
        if not isinstance(rollout, dict):
            raise BebopError(f"Bebop rollout settings {run_dir / TRL_ROLLOUT_FILE} is not a JSON object")
    config = {"mode": str(rollout.get("mode") or "none"), "speculate_k": rollout.get("speculate_k"),
              "mtp_loss": rollout.get("mtp_loss"), "mtp_update": "frozen", "trainer": "trl"}
    config["label"] = "trl:" + run_label(config)
    stats_path = run_dir / TOKEN_STATS_FILE
    token_stats = _check_token_stats(read_jsonl(stats_path, "token stats"), stats_path) if stats_path.exists() else None
    return Run(config["label"], config, metrics, token_stats, run_dir)


def as_float(value: Any) -> float:
    """Numbers as floats; None, booleans and anything else as NaN."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def metric_column(metrics: Sequence[Mapping], key: str) -> np.ndarray:
    """One scalar metric over steps, shape (S,), NaN where absent or null."""
    return np.array([as_float(row.get(key)) for row in metrics], dtype=float)
