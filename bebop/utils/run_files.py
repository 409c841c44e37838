"""A run directory's files by name, and the rows Bebop writes into them: one home for `bebop rl`, the TRL
integration (``bebop.integrations.trl``) and the analysis (``bebop.analysis.runs``) that reads both.

A `bebop rl` run directory holds ``CONFIG_FILE`` (the resolved config), ``METRICS_FILE`` (one row per
step) and, with drafts, ``TOKEN_STATS_FILE``. A TRL output directory rolled out by Bebop holds TRL's
log history (one of ``TRL_STATE_FILES``, or ``checkpoint-N/trainer_state.json``), ``ROLLOUT_FILE``
(what the rollout ran: mode, K, head, the sampling settings read from the trainer) and the same
``TOKEN_STATS_FILE``. Either may hold ``REPORT_DIR``, where ``bebop report RUN`` writes by default.

Token statistics (``token_stats_row``): one row per rollout, flat lists with one entry per kept draft
position (``TOKEN_STATS_KEYS``: depth j, H(p_j), alpha_RS, alpha_TO, and the completion row
``TOKEN_ROW_KEY``), keyed by ``step`` and, when a step rolled out more than once, ``ROLLOUT_KEY``.

Acceptance metrics are ``bebop.speculative.stats.SpecStats.to_metrics()``'s keys everywhere. A
logger that takes one number per key (TRL's) gets them through ``scalar_metrics`` (a list ``key``
becomes ``key/1``, ``key/2``, ...), and ``listed_metrics`` turns them back.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping
from typing import Any

from bebop.utils.errors import BebopError

CONFIG_FILE = "config.json"  # `bebop rl`: the resolved config of the run
METRICS_FILE = "metrics.jsonl"  # `bebop rl`: one JSON object per RL step
TOKEN_STATS_FILE = "token_stats.jsonl"  # both: per kept draft position, entropy and counterfactual acceptance
ROLLOUT_FILE = "bebop_rollout.json"  # TRL: the rollout's settings, as the rollout function read them
TRL_STATE_FILES = ("trainer_state.json", "log_history.json")  # TRL: its log history (a state dict, or the bare list)
REPORT_DIR = "report"  # `bebop report RUN` writes here when no --out is given; not one of the run's inputs
TOKEN_STATS_KEYS = ("position", "entropy", "alpha_rs", "alpha_to")  # flat lists, one entry per position
TOKEN_ROW_KEY = "row"  # flat list: the completion each position belongs to (files from older versions lack it)
ROLLOUT_KEY = "rollout"  # 1, 2, ...: the rollout within its step, when a step rolls out more than once (TRL)
_POSITION_KEY = re.compile(r"(spec/.+)/(\d+)")  # a per-position metric as ``scalar_metrics`` spells it


def json_safe(value: Any) -> Any:
    """NaN/inf floats -> None (JSON null), recursively, so a JSONL row is strict JSON.

    Example: {"a": [1.0, nan]} -> {"a": [1.0, None]}.
    """
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value


def token_stats_row(step: int, arrays: Mapping[str, Any], rollout: int | None = None) -> dict:
    """One ``TOKEN_STATS_FILE`` row from ``SpecStats.token_arrays()`` (tensors or arrays, each (M,)).

    ``row`` lets the analysis resample whole completions rather than correlated tokens; ``rollout``
    (TRL, a step that rolled out more than once) numbers the rollouts of the step from 1.
    """
    row = {"step": step, **({ROLLOUT_KEY: rollout} if rollout is not None else {}),
           "position": [int(j) for j in arrays["position"].tolist()],
           TOKEN_ROW_KEY: [int(r) for r in arrays[TOKEN_ROW_KEY].tolist()]}
    row.update({k: arrays[k].tolist() for k in ("entropy", "alpha_rs", "alpha_to")})
    return json_safe(row)


def check_token_stats(rows: list[dict], path) -> list[dict]:
    """``rows`` of a ``TOKEN_STATS_FILE``, checked: every list present and of one length; BebopError (one line) else."""
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


def last_of_each_step(rows: list[dict]) -> tuple[list[dict], int]:
    """Rows whose (step, rollout) repeats a later row's dropped, and how many were: a run resumed from
    a checkpoint logs again the steps after it, and the later rows are those of the run that went on.

    Example: steps [1, 2, 3, 2, 3, 4] -> [1, 2, 3, 4] (the first 2 and 3 dropped), 2.
    """
    last = {(row.get("step"), row.get(ROLLOUT_KEY, 1)): i for i, row in enumerate(rows)}
    kept = [row for i, row in enumerate(rows) if last[(row.get("step"), row.get(ROLLOUT_KEY, 1))] == i]
    return kept, len(rows) - len(kept)


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
    """``metrics`` as a logger that takes one number per key sees them (TRL's, which averages each key).

    A list ``key`` becomes ``key/1``, ``key/2``, ...; a string value ``v`` becomes ``key/v`` = 1.0 (so an
    average over rollouts is the share that ran ``v``); booleans 1.0 / 0.0; None NaN (what TRL logs as null).

    Example: {"spec/alpha_rs": [0.9, None], "auto/mode": "rs", "auto/probed": True}
        -> {"spec/alpha_rs/1": 0.9, "spec/alpha_rs/2": nan, "auto/mode/rs": 1.0, "auto/probed": 1.0}
    """
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, (list, tuple)):
            out.update({f"{key}/{j}": _number(v) for j, v in enumerate(value, start=1)})
        elif isinstance(value, str):
            out[f"{key}/{value}"] = 1.0
        else:
            out[key] = _number(value)
    return out


def _number(value: Any) -> float:
    return math.nan if value is None else float(value)


def listed_metrics(row: Mapping[str, Any]) -> dict:
    """``row`` with its per-position ``spec/<name>/j`` keys (``scalar_metrics``) also as the lists ``spec/<name>``
    (None where a depth is absent), as `bebop rl` logs them.

    Example: {"step": 3, "spec/alpha_rs/1": 0.9, "spec/alpha_rs/2": 0.8} -> {..., "spec/alpha_rs": [0.9, 0.8]}
    """
    depths: dict[str, int] = {}
    for key in row:
        if match := _POSITION_KEY.fullmatch(key):
            depths[match[1]] = max(depths.get(match[1], 0), int(match[2]))
    return {**row, **{key: [row.get(f"{key}/{j}") for j in range(1, n + 1)] for key, n in depths.items()}}


def shown_text(value: Any) -> Any:
    """Strings of a received file made safe to show in markdown: HTML escaped, square brackets escaped
    (so no link or image forms, e.g. one to ``javascript:``), line breaks as spaces (recursively
    through lists and dicts; other values as they are).

    Example: "<b>rs</b>" -> "&lt;b&gt;rs&lt;/b&gt;"; "[x](javascript:f())" -> "\\[x\\](javascript:f())".
    """
    if isinstance(value, str):
        text = html.escape(value, quote=False).replace("\r", " ").replace("\n", " ")
        return text.replace("[", "\\[").replace("]", "\\]")
    if isinstance(value, dict):
        return {shown_text(k): shown_text(v) for k, v in value.items()}
    if isinstance(value, list):
        return [shown_text(v) for v in value]
    return value
