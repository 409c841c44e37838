"""The process vLLM runs in, as Bebop prepares it, and the one line that says why vLLM failed.

1. torchvision: vLLM's Qwen3.5 module imports it. When ``import torchvision`` fails here (missing,
   or a build that does not load beside this torch), ``provide_torchvision`` puts the import-only
   stand-in of ``vllm_standin/`` first on ``sys.path`` and on ``PYTHONPATH`` (vLLM inspects model
   classes in a subprocess of its own, which inherits the variable).
2. Exact sampling: ``prepare_sampling`` runs ``vllm_cpu_fix.decide`` (probe the CPU fallback,
   repair it when wrong) and, when it repaired, exports ``vllm_cpu_fix.child_env`` so every
   process started later repairs it too.
3. vLLM's log (its ``vllm`` logger) goes to ``<workdir>/vllm.log``, not the terminal
   (``log_to_file``); a command's output stays its own. The workdir is the run's ``backend/``
   folder under ``bebop rl``, a fresh ``bebop-vllm-*`` folder in the system's temp dir otherwise.
4. ``failure_line`` turns what vLLM raised (and the log's tail) into one line naming the cause
   and the remedy, for the CLI to print (``VllmFailure``, a ``BebopError``).
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from pathlib import Path

from bebop.rollout import vllm_cpu_fix
from bebop.utils.errors import BebopError

LOG_NAME = "vllm.log"  # in the backend's workdir
STANDIN_DIR = Path(__file__).resolve().parent / "vllm_standin"  # holds the torchvision stand-in
LOG_TAIL_CHARS = 20_000  # of the log, searched for a known cause when the exception names none
SUPPORTED_CPU_HEAD_SIZES = "32, 64, 80, 96, 112, 128, 160, 192, 224 and 256"  # vLLM's CPU attention

# (pattern in the exception chain or the log's tail, the line's cause and remedy); the first that matches wins.
CAUSES = (
    (r"No module named '([\w.]+)'",
     "Python module {0} is missing from vLLM's environment: install it there (pip install {top})"),
    (r"Unsupported CPU attention configuration: head_dim=(\d+)",
     "vLLM's CPU attention does not support this model's head size {0} (it supports " + SUPPORTED_CPU_HEAD_SIZES +
     "): use --backend engine"),
    (r"No available memory for the cache blocks|less than requested memory for kv|KV cache is needed|"
     r"larger than the available KV cache memory",
     "no memory left for vLLM's KV cache: free memory, or size the cache yourself (VLLM_CPU_KVCACHE_SPACE=GiB "
     "on a CPU)"),
    (r"Model architectures \[([^\]]*)\] (?:failed to be inspected|are not supported)",
     "vLLM cannot load the model's architecture {0} (the log says why): use --backend engine"),
)


class VllmFailure(BebopError, RuntimeError):
    """vLLM could not start or generate: one line for the CLI (a ``BebopError``) and, as any engine crash,
    a ``RuntimeError`` (``check-lossless`` counts a setting whose sampling crashed as a failed check)."""


def provide_torchvision(environ=os.environ) -> bool:
    """Puts the torchvision stand-in on the path when ``import torchvision`` fails here; True when it is there."""
    if str(STANDIN_DIR) in sys.path:
        return True
    try:
        import torchvision  # noqa: F401
        return False
    except Exception:  # noqa: BLE001 - missing, or a build that fails to load (a CUDA build beside CPU torch)
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    sys.path.insert(0, str(STANDIN_DIR))
    environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(STANDIN_DIR), environ.get("PYTHONPATH")]))
    importlib.invalidate_caches()
    return True


def prepare_sampling(environ=os.environ) -> str:
    """``vllm_cpu_fix.decide``'s answer; after a repair, every later process repairs too (module docstring)."""
    found = vllm_cpu_fix.decide(environ)
    if found == vllm_cpu_fix.REPAIRED:
        environ.update(vllm_cpu_fix.child_env(environ))
    return found


def refusal(found: str, environ=os.environ) -> str | None:
    """The line refusing speculative sampling at T > 0 on a defective vLLM; None to sample (``BEBOP_VLLM_CPU_FIX=0``
    samples anyway: it exists to watch ``bebop check-lossless`` catch the defect)."""
    if found != vllm_cpu_fix.DEFECTIVE or environ.get(vllm_cpu_fix.ENV_FLAG) == "0":
        return None
    return (f"this vLLM expands per-request temperatures wrongly ({vllm_cpu_fix.TARGET}._expand_kernel_impl) and "
            "Bebop's repair did not take, so its speculative samples at T > 0 would not be the policy's: use "
            "--backend engine, --temperature 0 or --mode none")


def log_to_file(workdir: Path, environ=os.environ) -> Path | None:
    """Sends the ``vllm`` logger's records to ``workdir/vllm.log`` (appended) instead of the terminal.

    vLLM re-applies its own logging config at every engine start unless ``VLLM_CONFIGURE_LOGGING=0``,
    which this sets. A user's ``VLLM_LOGGING_CONFIG_PATH`` wins: nothing changes and this returns None.
    """
    if environ.get("VLLM_LOGGING_CONFIG_PATH"):
        return None
    environ["VLLM_CONFIGURE_LOGGING"] = "0"
    path = Path(workdir) / LOG_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    logger = logging.getLogger("vllm")
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"))
    logger.addHandler(handler)
    logger.propagate = False
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    return path


def _chain_text(error: BaseException) -> str:
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        parts.append(f"{type(error).__name__}: {error}")
        error = error.__cause__ or error.__context__
    return "\n".join(parts)


def failure_line(error: BaseException, log_path: Path | None, what: str = "start") -> str:
    """One line: why vLLM failed to ``what`` (cause and remedy), and where its log is."""
    text = _chain_text(error)
    if log_path is not None and Path(log_path).is_file():
        text += "\n" + Path(log_path).read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
    where = f"; vLLM's log: {log_path}" if log_path is not None else ""
    for pattern, cause in CAUSES:
        match = re.search(pattern, text)
        if match:
            top = (match.groups() or ("",))[0].split(".")[0]  # a missing module's package
            return f"vLLM could not {what}: " + cause.format(*match.groups(), top=top) + where
    last = next((line.strip() for line in reversed(str(error).splitlines()) if line.strip()), type(error).__name__)
    return f"vLLM could not {what}: {last}{where}"


def raise_failure(error: BaseException, log_path: Path | None, what: str = "start") -> None:
    """Raises ``VllmFailure(failure_line(...))`` from ``error``; a BebopError passes unchanged."""
    if isinstance(error, BebopError):
        raise error
    raise VllmFailure(failure_line(error, log_path, what)) from error
