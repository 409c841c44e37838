"""bebop.utils.allocator: freed large blocks leave the process under glibc; the user's variables win."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bebop.utils import allocator

ROOT = Path(__file__).resolve().parents[2]
needs_glibc = pytest.mark.skipif(allocator._glibc() is None, reason="the C library is not glibc")

# A fresh process frees one 20 MiB block (glibc's default then raises its mmap threshold to 20 MiB), then
# allocates and touches 24 blocks of 8 MiB, frees all but the last and reports how much resident memory
# the freed ones still hold.
HOLD_SCRIPT = """
import ctypes, json, sys
from bebop.utils.allocator import return_large_blocks

def rss_mb():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmRSS")) / 1024

applied = return_large_blocks() if sys.argv[1] == "on" else False
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = (ctypes.c_size_t,)
libc.free.argtypes = (ctypes.c_void_p,)
libc.memset.argtypes = (ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t)
big = libc.malloc(20 << 20); libc.memset(big, 1, 20 << 20); libc.free(big)
base = rss_mb()
blocks = [libc.malloc(8 << 20) for _ in range(24)]
for b in blocks:
    libc.memset(b, 1, 8 << 20)
for b in blocks[:-1]:
    libc.free(b)
print(json.dumps({"applied": applied, "held_mb": rss_mb() - base}))
"""


def _held(mode: str, **env) -> dict:
    proc = subprocess.run([sys.executable, "-c", HOLD_SCRIPT, mode], capture_output=True, text=True, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    return json.loads(proc.stdout)


@needs_glibc
def test_freed_blocks_leave_the_process():
    """184 MiB freed: the heap keeps nearly all of it by default and none of it once the threshold is fixed."""
    default, fixed = _held("off"), _held("on")
    assert fixed["applied"] and not default["applied"]
    assert default["held_mb"] > 150, default
    assert fixed["held_mb"] < 20, fixed


@needs_glibc
def test_the_users_variable_stands(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(64 << 20))
    assert allocator.return_large_blocks() is False
    held = _held("on", MALLOC_MMAP_THRESHOLD_=str(64 << 20))
    assert not held["applied"] and held["held_mb"] > 150, held


def test_no_glibc_is_a_no_op(monkeypatch):
    monkeypatch.setattr(allocator, "_glibc", lambda: None)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    assert allocator.return_large_blocks() is False
