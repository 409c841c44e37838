"""``load_model``: the target model of every command, a user's directory or the embedded default.

The one loader the CLI, the demo and the benches call: a ``save_pretrained`` directory
(``--model``) through ``bebop.pretrained``, or the embedded default (``bebop.embedded``) when none
is given.
"""

from __future__ import annotations

import os

import torch

from bebop.pretrained import load_pretrained
from bebop.utils.errors import BebopError


def load_model(model_dir: str | os.PathLike | None = None, device: str = "auto", show_progress: bool = True,
               dtype: str | torch.dtype = "auto", tokenizer: str | os.PathLike | None = None):
    """Loads an HF causal LM and its tokenizer from a local directory (the embedded model when None).

    The model is frozen, in eval mode, on ``device`` (``resolve_device``) with its weights in
    ``dtype`` (``resolve_dtype``: auto = bfloat16 on CUDA, float32 on CPU). ``tokenizer`` is a
    directory to load the tokenizer from instead of ``model_dir`` (a user's model only: the
    embedded model has its own).

    Raises BebopError with one clear line when the directory or its files are missing or corrupt,
    or the device or dtype is not available.
    """
    if model_dir is None:
        if tokenizer is not None:
            raise BebopError("--tokenizer needs --model: the embedded model has its own tokenizer")
        from bebop.embedded import load_embedded_model  # NOTE: imports transformers; --help stays light

        return load_embedded_model(device, show_progress, dtype)
    return load_pretrained(model_dir, device, dtype, tokenizer=tokenizer)
