"""Device choice and seeding."""

from __future__ import annotations

import random

import numpy as np
import torch

from bebop.utils.io import BebopError


def resolve_device(device: str | None = None) -> torch.device:
    """``"auto"``/None picks CUDA when present, else CPU; ``cpu``, ``cuda``, ``cuda:N`` or ``mps`` otherwise.

    Raises:
        BebopError: one line for a device name torch does not know or a device this machine lacks.
    """
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise BebopError(f"unknown device {device!r}; use cpu, cuda, cuda:N, mps or auto") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise BebopError(f"device {device!r} asked for, but CUDA is not available here (use --device cpu or auto)")
    if resolved.type == "cuda" and resolved.index is not None and resolved.index >= torch.cuda.device_count():
        raise BebopError(f"device {device!r} asked for, but this machine has {torch.cuda.device_count()} CUDA devices")
    if resolved.type == "mps" and not torch.backends.mps.is_available():
        raise BebopError(f"device {device!r} asked for, but MPS is not available here (use --device cpu or auto)")
    if resolved.type not in ("cpu", "cuda", "mps"):
        raise BebopError(f"unsupported device {device!r}; use cpu, cuda, cuda:N, mps or auto")
    return resolved


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (used only for weight init and data order; sampling takes explicit seeds)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
