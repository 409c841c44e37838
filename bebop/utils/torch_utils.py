"""Device and dtype choice (the compute dtype of Bebop's float math included), seeding and content hashes of weights."""

from __future__ import annotations

import functools
import hashlib
import inspect
import random

import numpy as np
import torch

from bebop.utils.errors import BebopError


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


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}  # --dtype choices besides auto
# NOTE: float16 is refused: its 5-bit exponent overflows in attention and softmax without loss scaling,
# which bf16 (float32's exponent) needs neither for training nor for sampling.


def resolve_dtype(dtype: str | torch.dtype | None, device: torch.device | str | None = None) -> torch.dtype:
    """The dtype a model's weights are loaded in: ``"auto"``/None, ``float32`` or ``bfloat16``.

    ``auto`` is bfloat16 on a CUDA device that supports it and float32 everywhere else: CPU bf16
    speed depends on the chip (bf16 can speed up large forwards yet slow down small decode steps;
    docs/results.md), and float32 keeps CPU runs bit-comparable with the cached embedded model.
    Losses, acceptance statistics and sampling probabilities are float32 whatever this returns.

    Example: ``resolve_dtype("auto", "cpu") == torch.float32``; ``resolve_dtype("bfloat16") == torch.bfloat16``.

    Raises:
        BebopError: one line for any other name (float16 included, see DTYPES).
    """
    if isinstance(dtype, torch.dtype) and dtype in DTYPES.values():
        return dtype
    if dtype in (None, "auto"):
        device = resolve_device(device) if not isinstance(device, torch.device) else device
        cuda_bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
        return torch.bfloat16 if cuda_bf16 else torch.float32
    if dtype not in DTYPES:
        raise BebopError(f"unsupported dtype {str(dtype).removeprefix('torch.')!r}; use auto, float32 or bfloat16 "
                         "(float16 needs loss scaling; bfloat16 does not)")
    return DTYPES[dtype]


def compute_dtype(*inputs: torch.Tensor | torch.dtype | None) -> torch.dtype:
    """The dtype probabilities, losses and statistics are computed in: float32, or float64 when an input
    (a tensor or a dtype; None is skipped) is float64; half precision is upcast for the math.

    Example: ``compute_dtype(torch.bfloat16, None) == torch.float32``.
    """
    out = torch.float32
    for x in inputs:
        if x is not None:
            out = torch.promote_types(out, x if isinstance(x, torch.dtype) else x.dtype)
    return out


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the --dtype spelling, for configs and messages)."""
    return str(dtype).removeprefix("torch.")


def seed_everything(seed: int) -> None:
    """Seeds Python, NumPy and torch (used only for weight init and data order; sampling takes explicit seeds)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def state_sha256(module: torch.nn.Module) -> str:
    """SHA-256 (hex) of a module's ``state_dict``: names, dtypes, shapes and values, in key order.

    Two models with the same weights hash alike wherever they live (CPU or GPU, loaded or trained);
    one changed value changes the hash. Cache entries derived from a model record it.
    """
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous().reshape(-1)
        digest.update(f"{name}|{t.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


@functools.cache
def _takes_cache(cls: type) -> bool:
    return "cache" in inspect.signature(cls.forward).parameters


def cache_kwargs(module: torch.nn.Module, cache) -> dict:
    """``{name: cache}`` for ``module.forward``: ``cache`` since transformers renamed it, ``past_key_values`` before.

    Example: ``decoder(input_ids=ids, **cache_kwargs(decoder, kv))`` works on transformers 5.19 and 5.24.

    Delete when the oldest transformers Bebop installs (``transformers>=`` in pyproject.toml) names the argument
    ``cache`` in every model's ``forward``: then callers pass ``cache=`` themselves.
    """
    return {"cache" if _takes_cache(type(module)) else "past_key_values": cache}


def release_inference_buffers(*modules: torch.nn.Module | None) -> int:
    """Replaces every buffer of ``modules`` that is an inference tensor with a normal copy; returns how many.

    A model may create a buffer during a forward (a dynamic rotary's ``inv_freq``); under
    ``torch.inference_mode`` that buffer is an inference tensor, which autograd refuses to save and which
    no op outside inference mode may change in place, so a training step after the rollout would fail
    on it. The decoder calls this once per call, after its last step. None entries are skipped.
    """
    released = 0
    for module in modules:
        for sub in module.modules() if module is not None else ():
            for name, buffer in sub._buffers.items():
                if buffer is not None and buffer.is_inference():
                    sub._buffers[name] = buffer.clone()
                    released += 1
    return released
