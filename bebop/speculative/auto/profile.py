"""Auto profiles: what ``--mode auto`` / ``--speculate-k auto`` learned, kept between ``bebop generate`` calls.

A call that starts from nothing probes settings and prices its rows as running to max_new_tokens (it
has seen no completion lengths): at B = 16 and 64 here that chose a deeper K than the best in most
calls (bench/auto.py, "one-shot"). A profile is the ``AutoChooser``'s state (acceptance per depth,
offset and K, the last probe's step costs, completion lengths, that probe's decision) in a JSON
file; the next call on the same model, head, device and sampling starts from it and runs as ``bebop
rl`` runs auto: a probing call every AUTO_EVERY calls, in between the last probe's decision (no
probe steps, no pricing).

    key     what the profile is for (``profile_key``): the model and head directories (path, newest
            file mtime, bytes), device, dtype, torch threads, sampling and the candidate settings.
            A profile whose key differs is refused, not reused.
    path    ``--auto-profile PATH``; by default one file per key under
            $BEBOP_CACHE_DIR/auto-profiles/ (``default_path``); ``--auto-profile none``: no profile.

Example:
    chooser, calls = load(path, key)           # a fresh chooser and 0 when the file does not exist
    ... generate_auto(..., chooser=chooser, probe=calls % AUTO_EVERY == 0) ...
    save(path, key, chooser, calls + 1)        # through a temporary file and a rename
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from bebop.speculative.auto.chooser import AutoChooser, candidates, config_name
from bebop.speculative.settings import SamplingParams, SpecConfig
from bebop.utils.io import BebopError, read_json, write_json

VERSION = 3  # of the file's layout; an older one is a fresh start (replaced by the next save), a newer one refused


def _fingerprint(path: str | os.PathLike) -> dict:
    """A directory's identity: absolute path, newest mtime and total bytes of its files (a model
    retrained in place gets a new fingerprint)."""
    path = Path(path).resolve()
    files = [f for f in path.iterdir() if f.is_file()] if path.is_dir() else []
    stats = [f.stat() for f in files]
    return {"path": str(path), "mtime_ns": max((s.st_mtime_ns for s in stats), default=0),
            "bytes": sum(s.st_size for s in stats)}


def profile_key(model_dir, mtp_dir, device: torch.device, dtype: torch.dtype, sampling: SamplingParams,
                spec: SpecConfig) -> dict:
    """What a profile is for: the costs depend on the model, head, device, dtype and threads, the
    acceptance and lengths on the sampling too."""
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
    from bebop.embedded import cache_dir

    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / "auto-profiles" / f"{digest}.json"


def load(path: str | os.PathLike, key: dict) -> tuple[AutoChooser, int]:
    """(chooser, calls made with it) from ``path``; a fresh chooser and 0 when the file does not exist or
    is a profile of an older layout (version 1 carried a calibration and re-pricing state this
    version's chooser does not have; version 2 lacked the pending confirmation, ``AutoChooser.settle``).

    Raises BebopError (one line) when the file is not a profile of this or an older version, is for
    another key, or does not parse.
    """
    path = Path(path)
    if not path.exists():
        return AutoChooser(), 0
    data = read_json(path, "auto profile")
    if isinstance(data, dict) and type(data.get("version")) is int and 1 <= data["version"] < VERSION:
        return AutoChooser(), 0
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
        return AutoChooser.from_state(data["chooser"]), calls
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise BebopError(f"auto profile {path} is corrupt ({type(e).__name__}: {e}); delete it or pass "
                         f"--auto-profile none") from None


def save(path: str | os.PathLike, key: dict, chooser: AutoChooser, calls: int) -> None:
    """Writes the profile through a temporary file and a rename (a reader never sees half a file)."""
    write_json(path, {"version": VERSION, "key": key, "calls": calls, "chooser": chooser.to_state()})
