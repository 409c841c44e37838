"""``load_model``: an HF causal LM and its tokenizer from a local directory, frozen, for every command.

The one loader of target models: the CLI, the demo and the benches read a ``save_pretrained``
directory (``--model``) through it, and the embedded default (``bebop.embedded``) when none is
given. Nothing is downloaded (``local_files_only``); the architecture must be one Bebop runs
(``bebop.architectures``).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError

from bebop.architectures import check_architecture
from bebop.utils.io import BebopError
from bebop.utils.torch_utils import resolve_device, resolve_dtype


UNPICKLABLE = ("not a file of tensors (corrupt, or a pickle of other objects, refused because loading it could run "
               "code)")  # NOTE: what torch's weights_only loader refuses; its own advice is to load it unsafely


def load_model(model_dir: str | os.PathLike | None = None, device: str = "auto", show_progress: bool = True,
               dtype: str | torch.dtype = "auto"):
    """Loads an HF causal LM and its tokenizer from a local directory (the embedded model when None).

    The model is frozen, in eval mode, on ``device`` (``resolve_device``) with its weights in
    ``dtype`` (``resolve_dtype``: auto = bfloat16 on CUDA, float32 on CPU).

    Raises BebopError with one clear line when the directory or its files are missing or corrupt,
    or the device or dtype is not available.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = resolve_device(device)  # a bad --device or --dtype fails before any loading or pretraining
    weights_dtype = resolve_dtype(dtype, target)
    if model_dir is None:
        from bebop.embedded import ensure_embedded_model

        path = ensure_embedded_model(show_progress)
    else:
        path = Path(model_dir)
    if not (path / "config.json").is_file():
        raise BebopError(f"model directory {path} has no config.json (expected a save_pretrained directory)")
    try:
        model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=weights_dtype)
        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError, json.JSONDecodeError, SafetensorError, pickle.UnpicklingError, RuntimeError) as e:
        # NOTE: a corrupt pickled *.bin raises UnpicklingError (torch's weights_only loader) or RuntimeError (zip)
        weights = ", ".join(sorted(p.name for p in [*path.glob("*.safetensors"), *path.glob("*.bin")])) or \
            "no *.safetensors or *.bin"
        fix = f"; it is the cached embedded model: delete {path} and it is pretrained again on next use" \
            if model_dir is None else ""
        reason = UNPICKLABLE if isinstance(e, pickle.UnpicklingError) else str(e).splitlines()[0]
        raise BebopError(f"cannot load model from {path} ({weights}): {reason}{fix}") from None
    check_architecture(model)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.to(target).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, tok
