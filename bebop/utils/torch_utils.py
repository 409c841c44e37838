"""Device choice and seeding."""

from __future__ import annotations

import random

import numpy as np
import torch


def resolve_device(device: str | None = None) -> torch.device:
    """``"auto"``/None picks CUDA when present, else CPU."""
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (used only for weight init and data order; sampling takes explicit seeds)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
