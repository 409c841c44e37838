"""Prompt datasets for RL: JSONL or parquet rows with a required ``prompt`` field.

Every row is a dict. ``prompt`` is a string, or a list of chat messages (``{"role", "content"}``
dicts) passed through untouched for a chat template. Other fields (``answer``, ...) are kept as
they are and reach reward functions as keyword lists (see ``bebop.rl.rewards``).
"""

from __future__ import annotations

from pathlib import Path

from bebop.utils.files import check_input_file, parse_json, read_text

PROMPT_FIELD = "prompt"  # the one field every row must have
JSONL_SUFFIXES = (".jsonl", ".ndjson")  # one JSON object per line
PARQUET_SUFFIXES = (".parquet", ".pq")


def _check_row(row: object, where: str) -> dict:
    """Returns ``row`` if it is a dict with a usable prompt; ValueError naming ``where`` if not."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(row).__name__}")
    if PROMPT_FIELD not in row:
        raise ValueError(
            f"{where}: missing required field {PROMPT_FIELD!r} (fields: {sorted(row)})"
        )
    if not isinstance(row[PROMPT_FIELD], (str, list)):
        raise ValueError(
            f"{where}: {PROMPT_FIELD!r} must be a string or a list of chat messages, "
            f"got {type(row[PROMPT_FIELD]).__name__}"
        )
    return row


def _read_jsonl(path: Path) -> list[tuple[str, dict]]:
    """(where, row) of a JSONL file; blank lines are skipped, ``where`` names the 1-based line."""
    rows = []
    for line_no, line in enumerate(read_text(path, "prompt file").splitlines(), start=1):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}:{line_no}")
        rows.append((f"{path}:{line_no}", _check_row(row, f"{path}:{line_no}")))
    return rows


def _read_parquet(path: Path) -> list[tuple[str, dict]]:
    """(where, row) of a parquet file; pyarrow is imported here so it stays an optional dependency."""
    try:
        import pyarrow.parquet as pq
    except ImportError as err:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from err
    rows = pq.read_table(path).to_pylist()
    return [(f"{path}: row {index}", _check_row(row, f"{path}: row {index}")) for index, row in enumerate(rows)]


def load_prompts(path: str | Path) -> list[dict]:
    """Loads an RL prompt set from a ``.jsonl`` or ``.parquet`` file.

    Example:
        A file holding ``{"prompt": "2+2?", "answer": "4"}`` on one line gives
        ``[{"prompt": "2+2?", "answer": "4"}]``.

    Args:
        path: a JSONL file (one object per line; ``.jsonl``/``.ndjson``) or a parquet file
            (``.parquet``/``.pq``).

    Returns:
        One dict per row, in file order, each with a ``prompt``.

    Raises:
        BebopError: no such file, or not a regular file (a directory, a pipe).
        ValueError: unknown suffix, a row without ``prompt``, or no rows.
        BebopError: bad JSON, or JSON nested deeper than the parser recurses (with its line).
        ImportError: a parquet file but pyarrow is not installed.
    """
    return [row for _, row in load_prompt_rows(path)]


def load_prompt_rows(path: str | Path) -> list[tuple[str, dict]]:
    """``load_prompts`` with where each row came from (``"file:line"`` or ``"file: row i"``) for errors."""
    path = check_input_file(path, "prompt file")
    suffix = path.suffix.lower()
    if suffix in JSONL_SUFFIXES:
        rows = _read_jsonl(path)
    elif suffix in PARQUET_SUFFIXES:
        rows = _read_parquet(path)
    else:
        raise ValueError(
            f"{path}: unsupported prompt file type {suffix!r}; use one of "
            f"{JSONL_SUFFIXES + PARQUET_SUFFIXES}"
        )
    if not rows:
        raise ValueError(f"{path}: no prompts (the file is empty)")
    return rows
