"""``load_pretrained``: an HF causal LM and its tokenizer from a local ``save_pretrained`` directory, frozen.

Nothing is downloaded (``local_files_only``); the architecture must be one Bebop runs
(``bebop.architectures``). ``bebop.models.load_model`` (a user's ``--model`` or the embedded
default) and ``bebop.embedded`` (its own cache) both load through it.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError

from bebop.architectures import check_architecture
from bebop.utils.errors import BebopError
from bebop.utils.torch_utils import resolve_device, resolve_dtype

UNPICKLABLE = ("not a file of tensors (corrupt, or a pickle of other objects, refused because loading it could run "
               "code)")  # NOTE: what torch's weights_only loader refuses; its own advice is to load it unsafely


def load_pretrained(path: str | os.PathLike, device: str = "auto", dtype: str | torch.dtype = "auto",
                    fix: str = ""):
    """Loads the model and tokenizer saved in ``path``: frozen, in eval mode, on ``device``, weights in ``dtype``.

    Args:
        path: A ``save_pretrained`` directory (config.json, weights, tokenizer).
        device: ``resolve_device``'s names (auto = CUDA when present, else CPU).
        dtype: ``resolve_dtype``'s names (auto = bfloat16 on CUDA, float32 on CPU).
        fix: Appended to the error line when the files cannot be loaded (how to repair them).

    Returns:
        (model, tokenizer); the tokenizer's pad token is its EOS token when it has none.

    Raises:
        BebopError: one clear line when the directory or its files are missing or corrupt, or the
            device or dtype is not available.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = resolve_device(device)
    weights_dtype = resolve_dtype(dtype, target)
    path = Path(path)
    if not (path / "config.json").is_file():
        raise BebopError(f"model directory {path} has no config.json (expected a save_pretrained directory)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=weights_dtype)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, json.JSONDecodeError, SafetensorError, pickle.UnpicklingError, RuntimeError,
            RecursionError) as e:
        # NOTE: a corrupt pickled *.bin raises UnpicklingError (torch's weights_only loader) or RuntimeError (zip)
        weights = ", ".join(sorted(p.name for p in [*path.glob("*.safetensors"), *path.glob("*.bin")])) or \
            "no *.safetensors or *.bin"
        reason = UNPICKLABLE if isinstance(e, pickle.UnpicklingError) else (str(e) or type(e).__name__).splitlines()[0]
        raise BebopError((_file_at_fault(path) or f"cannot load model from {path} ({weights}): {reason}") + fix) from None
    check_architecture(model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.to(target).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok


def _file_at_fault(path: Path) -> str | None:
    """The first file of a model directory that cannot be read, named with why: its JSON files (a
    sharded checkpoint's index, the config) and each safetensors file's header; None when each reads."""
    from safetensors import safe_open

    from bebop.utils.files import read_json

    for file in sorted(path.glob("*.json")):
        try:
            read_json(file, what="model file")
        except BebopError as e:
            return f"cannot load model from {path}: {e}"
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), framework="pt"):
                pass
        except Exception as e:  # noqa: BLE001 - any failure to read the header is a corrupt file
            return f"cannot load model from {path}: weights file {file.name} is corrupt: {str(e).splitlines()[0]}"
    return None
