"""RL run directories as written by ``bebop rl`` or by TRL with Bebop's rollouts: loading and checking them.

The files and their rows are those of ``bebop.utils.run_files``. A `bebop rl` run directory holds
``config.json`` (the resolved config), ``metrics.jsonl`` (one object per RL step) and optionally
``token_stats.jsonl`` (per kept draft position: depth j, completion row, H(p), alpha_RS, alpha_TO).
A TRL output directory (``GRPOTrainer`` with ``bebop.integrations.trl``) holds TRL's log history
instead (``trainer_state.json``, ``log_history.json`` or the newest ``checkpoint-N/trainer_state.json``),
optionally ``bebop_rollout.json`` and the same ``token_stats.jsonl``; a directory with a log history and
no ``metrics.jsonl`` is read as TRL's, whatever else it holds (``trainer.save_model`` leaves the model's
``config.json`` there). TRL's rows become metrics rows by ``TRL_KEYS`` (TRL's mean reward stands for
accuracy), and the per-position ``spec/<name>/j`` keys become the lists ``spec/<name>``.

Bad files give one ``BebopError`` line naming the file. A torn last line of a JSONL log (a run killed
while appending) is left out with a note, and so are rows of a step logged again later (a run resumed
from an earlier checkpoint): the later row is kept. Strings a received file supplies are HTML-escaped
(``shown_text``), since the report copies them into markdown.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bebop.utils.errors import BebopError
from bebop.utils.files import check_input_file, read_json, read_jsonl
from bebop.utils.progress import say
from bebop.utils.run_files import (
    CONFIG_FILE,
    METRICS_FILE,
    REPORT_DIR,
    ROLLOUT_FILE,
    TOKEN_STATS_FILE,
    TRL_STATE_FILES,
    check_token_stats,
    last_of_each_step,
    listed_metrics,
    shown_text,
)

TRL_KEYS = {"target_entropy": ("spec/target_entropy", "entropy"), "rollout_s": ("spec/rollout_seconds",),
            "step_s": ("step_time",), "accuracy": ("reward",)}  # metrics key <- first TRL key not null
TRL_MODES = ("none", "to", "rs", "auto")  # the modes a bebop_rollout.json may name


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
    """Returns ``config["label"]`` or builds one from mode, head loss, update and asynchronous rollouts.

    Example:
        >>> run_label({"mode": "to", "mtp_loss": "ce", "mtp_update": "online", "online_loss": "ce"})
        'to+ce+online-ce'
        >>> run_label({"mode": "none", "async_rollout": True})
        'none+async'
    """
    if config.get("label"):
        return str(config["label"])
    mode = str(config.get("mode") or "none")
    parts = [mode]
    if mode != "none":
        parts.append(str(config.get("mtp_loss") or "head"))
        if config.get("mtp_update") == "online":
            parts.append(f"online-{config.get('online_loss') or 'ce'}")
    if config.get("async_rollout") is True:
        parts.append("async")
    return "+".join(parts)


def _check_metrics(rows: list[dict], path: Path) -> list[dict]:
    if not rows:
        raise BebopError(f"metrics {path} has no steps")
    for i, row in enumerate(rows, start=1):
        if not isinstance(row.get("step"), int) or isinstance(row.get("step"), bool):
            raise BebopError(f"metrics {path} row {i} has no integer 'step'")
    return sorted(_last_of_each_step(rows, path), key=lambda r: r["step"])


def _last_of_each_step(rows: list[dict], path: Path) -> list[dict]:
    kept, dropped = last_of_each_step(rows)
    if dropped:
        say(f"bebop: note: {path}: left out {dropped} row(s) of steps logged again later (a run resumed from an "
            "earlier checkpoint); the later rows are kept")
    return kept


def _read_log(path: Path, what: str) -> list[dict]:
    """A run's JSONL log; a torn last line (a run killed while appending) is dropped with a note, as
    ``bebop rl --resume`` drops it; a corrupt line elsewhere is an error."""
    try:
        return read_jsonl(path, what)
    except BebopError:
        rows = read_jsonl(path, what, torn_tail_ok=True)  # NOTE: raises again unless only the last line is torn
    say(f"bebop: note: {path}: left out its torn last line (a run stopped while writing it; --resume drops it too)")
    return rows


def _read_token_stats(run_dir: Path) -> list[dict] | None:
    """The run's token statistics, checked; None without the file."""
    path = run_dir / TOKEN_STATS_FILE
    if not path.exists():
        return None
    return check_token_stats(_last_of_each_step(_read_log(path, "token stats"), path), path)


def load_run(run_dir: str | os.PathLike) -> Run:
    """Reads a run directory.

    Args:
        run_dir: Directory holding config.json, metrics.jsonl and optionally token_stats.jsonl, or a
            TRL output directory (the module docstring).

    Returns:
        The run, metrics sorted by step.

    Raises:
        BebopError: With one line naming the file and the problem, when a file is missing,
            is not valid JSON, or lacks what the analysis needs.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise BebopError(f"run directory not found: {run_dir}")
    if not (run_dir / METRICS_FILE).exists():
        if trl_state_file(run_dir) is not None:
            return load_trl_run(run_dir)
        if not _is_run_config(run_dir / CONFIG_FILE):
            raise BebopError(no_log_history(run_dir))
    config = read_json(run_dir / CONFIG_FILE, "run config")
    if not isinstance(config, dict):
        raise BebopError(f"run config {run_dir / CONFIG_FILE} is not a JSON object")
    config = shown_text(config)
    metrics = _check_metrics(shown_text(_read_log(run_dir / METRICS_FILE, "metrics")), run_dir / METRICS_FILE)
    return Run(run_label(config), config, metrics, _read_token_stats(run_dir), run_dir)


def run_inputs(run: Run) -> tuple[Path, ...]:
    """What a report on ``run`` must not write over or move aside: everything its directory holds (files
    read, checkpoints, a served model) but ``REPORT_DIR``, the default place of its report."""
    if run.path is None:
        return ()
    return tuple(p for p in sorted(run.path.iterdir()) if p.name != REPORT_DIR)


def _is_run_config(path: Path) -> bool:
    """Whether ``path`` is there and is not a model's config.json (``trainer.save_model()`` leaves one in a TRL
    output directory; a `bebop rl` run's config names no ``model_type``)."""
    if not path.exists():
        return False
    with contextlib.suppress(BebopError):
        config = read_json(path, "run config")
        return not (isinstance(config, dict) and "model_type" in config)
    return True  # NOTE: a broken file is read again by the caller, which names what is wrong with it


def no_log_history(run_dir: Path) -> str:
    """The one line for a directory with neither a `bebop rl` run's files nor TRL's log history."""
    return (f"{run_dir} holds no run log: neither a `bebop rl` run's {METRICS_FILE} nor TRL's {TRL_STATE_FILES[0]}, "
            f"which TRL writes only at a checkpoint; with save_strategy=\"no\", call trainer.save_state() after "
            f"trainer.train() (it writes {run_dir / TRL_STATE_FILES[0]})")


def trl_state_file(run_dir: Path) -> Path | None:
    """The file holding a TRL output directory's log history, or None when it has none."""
    for name in TRL_STATE_FILES:
        if (run_dir / name).exists():  # NOTE: a directory or a pipe of that name is refused as such
            return check_input_file(run_dir / name, "TRL log history")
    checkpoints = [p for p in run_dir.glob("checkpoint-*/trainer_state.json") if p.parent.name[11:].isdigit()]
    return max(checkpoints, key=lambda p: int(p.parent.name[11:]), default=None)


def trl_metrics_row(row: Mapping[str, Any]) -> dict:
    """One TRL log-history row as a metrics row (``TRL_KEYS``, per-position lists).

    Example: {"step": 3, "reward": 0.5, "spec/alpha_rs/1": 0.9, "spec/alpha_rs/2": 0.8}
        -> {..., "step": 3, "accuracy": 0.5, "spec/alpha_rs": [0.9, 0.8]}
    """
    out = listed_metrics(row)
    for key, sources in TRL_KEYS.items():
        out[key] = next((row[s] for s in sources if row.get(s) is not None), None)  # NOTE: TRL logs null for all-NaN
    return out


def _rollout_settings(run_dir: Path) -> dict:
    """The rollout's settings from ``bebop_rollout.json``, checked; empty without the file."""
    path = run_dir / ROLLOUT_FILE
    if not path.exists():
        return {}
    rollout = read_json(path, "Bebop rollout settings")
    if not isinstance(rollout, dict):
        raise BebopError(f"Bebop rollout settings {path} is not a JSON object")
    if rollout.get("mode") not in (None, *TRL_MODES):
        raise BebopError(f"Bebop rollout settings {path}: mode must be one of {', '.join(TRL_MODES)}")
    k = rollout.get("speculate_k")
    if not (k is None or k == "auto" or (isinstance(k, int) and not isinstance(k, bool))):
        raise BebopError(f"Bebop rollout settings {path}: speculate_k must be an integer or auto")
    return shown_text(rollout)


def load_trl_run(run_dir: str | os.PathLike) -> Run:
    """Reads a TRL output directory (see the module docstring); BebopError (one line) on a bad file."""
    run_dir = Path(run_dir)
    path = trl_state_file(run_dir)
    if path is None:
        raise BebopError(no_log_history(run_dir))
    state = read_json(path, "TRL log history")
    history = state.get("log_history") if isinstance(state, dict) else state
    if not isinstance(history, list) or not all(isinstance(r, dict) for r in history):
        raise BebopError(f"TRL log history {path} is not a list of objects")
    rows = [trl_metrics_row(r) for r in shown_text(history)
            if "step" in r and ("loss" in r or "spec/accept_length" in r)]
    metrics = _check_metrics(rows, path)
    rollout = _rollout_settings(run_dir)
    config = {"mode": str(rollout.get("mode") or "none"), "speculate_k": rollout.get("speculate_k"),
              "mtp_loss": rollout.get("mtp_loss"), "mtp_update": "frozen", "trainer": "trl",
              "sampling": rollout.get("sampling")}
    config["label"] = "trl:" + run_label(config)
    return Run(config["label"], config, metrics, _read_token_stats(run_dir), run_dir)


def as_float(value: Any) -> float:
    """Numbers as floats; None, booleans and anything else as NaN."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return math.nan


def metric_column(metrics: Sequence[Mapping], key: str) -> np.ndarray:
    """One scalar metric over steps, shape (S,), NaN where absent or null."""
    return np.array([as_float(row.get(key)) for row in metrics], dtype=float)
