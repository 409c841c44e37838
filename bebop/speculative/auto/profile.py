"""Auto profiles: what ``--mode auto`` / ``--speculate-k auto`` learned, kept between ``bebop generate`` calls.

A JSON file of an ``AutoChooser``'s state (not its step costs) and call count for one setup (``profile_key``),
at ``--auto-profile PATH`` or ``default_path``: with it, ``bebop generate`` calls follow the probe schedule
as ``bebop rl``'s do; without, a call has seen no lengths and prices its rows as running to max_new_tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from bebop.speculative.auto.chooser import AutoChooser, candidates, config_name
from bebop.speculative.settings import SamplingParams, SpecConfig
from bebop.utils.cache import cache_dir
from bebop.utils.errors import BebopError
from bebop.utils.files import read_json, write_json

VERSION = 4  # of the file's layout; an older one is a fresh start (replaced by the next save), a newer one refused


def _fingerprint(path: str | os.PathLike) -> dict:
    """A directory's absolute path, newest mtime and total bytes of its files (a model retrained in place differs)."""
    path = Path(path).resolve()
    files = [f for f in path.iterdir() if f.is_file()] if path.is_dir() else []
    stats = [f.stat() for f in files]
    return {"path": str(path), "mtime_ns": max((s.st_mtime_ns for s in stats), default=0),
            "bytes": sum(s.st_size for s in stats)}


def profile_key(model_dir, mtp_dir, device: torch.device, dtype: torch.dtype, sampling: SamplingParams,
                spec: SpecConfig) -> dict:
    """What a profile is for: model and head (``_fingerprint``), device, dtype, threads, sampling, candidates."""
    device = torch.device(device)
    return {
        "model": _fingerprint(model_dir), "mtp": _fingerprint(mtp_dir) if mtp_dir is not None else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else device.type,
        "dtype": str(dtype).removeprefix("torch."), "threads": torch.get_num_threads(),
        "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
        "filter_drafts": spec.filter_drafts, "draft_temperature": spec.draft_temperature,
        "candidates": [config_name(m, k) for m, k in candidates(spec)],
    }


def default_path(key: dict) -> Path:
    """$BEBOP_CACHE_DIR/auto-profiles/<16 hex digits of the key's hash>.json."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "auto-profiles" / f"{digest}.json"


def load(path: str | os.PathLike, key: dict) -> AutoChooser:
    """The chooser saved at ``path``, its ``calls`` restored; a fresh chooser when the file does not exist,
    has an older layout, or is corrupt (not JSON, fields that do not fit, NaN, infinite or absurd numbers,
    unknown setting names: moved to ``NAME.bad`` with a one-line warning). Raises BebopError (one line), the
    file left as it is, for a newer version's profile or another key's."""
    path = Path(path)
    if not path.exists():
        return AutoChooser()
    try:
        data = read_json(path, "auto profile")
    except (BebopError, UnicodeDecodeError) as e:  # NOTE: not JSON (a torn or edited file): a corrupt profile
        if not path.is_file():
            raise
        return _set_aside(path, str(e))
    if isinstance(data, dict) and type(data.get("version")) is int and 1 <= data["version"] < VERSION:
        return AutoChooser()
    if not isinstance(data, dict) or data.get("version") != VERSION:
        version = data.get("version") if isinstance(data, dict) else None
        raise BebopError(f"auto profile {path} is not a version-{VERSION} profile (version {version!r}); "
                         f"delete it or pass --auto-profile none")
    if data.get("key") != key:
        other = data.get("key") if isinstance(data.get("key"), dict) else {}
        fields = sorted(f for f in set(key) | set(other) if key.get(f) != other.get(f))
        raise BebopError(f"auto profile {path} was made for another setup ({', '.join(fields)} differ); "
                         f"pass another --auto-profile or none")
    try:
        calls = int(data["calls"])
        if calls < 0:
            raise ValueError(f"calls {calls} < 0")
        _check_numbers(data["chooser"], "chooser")
        chooser = AutoChooser.from_state(data["chooser"])
        chooser.calls = calls
        return chooser
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        return _set_aside(path, f"{type(e).__name__}: {e}")


MAX_VALUE = 1e15  # bound on a profile's numbers (seconds, counts, rates): beyond it a file was edited


def _check_numbers(state, where: str) -> None:
    """ValueError naming the first number in ``state`` (nested) that is NaN, infinite or beyond +-MAX_VALUE."""
    if isinstance(state, dict):
        for name, value in state.items():
            _check_numbers(value, f"{where}.{name}")
    elif isinstance(state, list):
        for i, value in enumerate(state):
            _check_numbers(value, f"{where}[{i}]")
    elif isinstance(state, (int, float)) and not isinstance(state, bool) and not abs(state) <= MAX_VALUE:
        raise ValueError(f"{where} is {state!r}")


def _set_aside(path: Path, reason: str) -> AutoChooser:
    """Renames a corrupt profile to ``NAME.bad`` (``NAME.bad-2``, ... if taken), warns in one line: a fresh chooser."""
    from bebop.utils.progress import say

    bad = path.with_name(path.name + ".bad")
    for n in range(2, 1000):
        if not bad.exists():
            break
        bad = path.with_name(f"{path.name}.bad-{n}")
    os.replace(path, bad)
    say(f"bebop: warning: auto profile {path} is corrupt ({' '.join(reason.split())[:200]}); moved it to {bad} "
        "and starting afresh")
    return AutoChooser()


def save(path: str | os.PathLike, key: dict, chooser: AutoChooser) -> None:
    """Writes the profile through a temporary file and a rename (a reader never sees half a file)."""
    write_json(path, {"version": VERSION, "key": key, "calls": chooser.calls, "chooser": chooser.to_state()})
