"""The C allocator's hold on freed memory: large blocks go back to the operating system when freed.

glibc's malloc serves a block above its mmap threshold with a mapping of its own, unmapped on
``free``; smaller blocks come from its heap, which keeps what is freed for reuse. The threshold
starts at 128 KiB and, by default, rises to the size of every mapped block freed, up to 32 MiB. A
decoding or RL step at a real vocabulary frees tensors of a few MB to tens of MB every step
((rows, V) float32 logits are 19 MB for 32 rows at V = 151,936), so after the first of them the
threshold has risen and later ones land in the heap, whose fragments it keeps: the process's peak
grows with steps and with the torch build's allocation pattern, not with its live tensors.

``return_large_blocks`` fixes the threshold at ``MMAP_THRESHOLD_BYTES`` (which also stops its rise)
and the heap's trim threshold at twice that, as ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` would. It does nothing where the C library is not glibc, or where the
user set either variable (their setting stands). Measured in docs/scaling.md (the allocator section).
"""

from __future__ import annotations

import ctypes
import os

MMAP_THRESHOLD_BYTES = 1 << 20  # blocks of 1 MiB and more get their own mapping, returned when freed
TRIM_THRESHOLD_BYTES = 2 * MMAP_THRESHOLD_BYTES  # free heap top above this is returned (glibc's own 2x rule)
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameter numbers in glibc's malloc.h
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")  # glibc reads these at start


def _glibc():
    """The process's C library when it is glibc, else None."""
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "gnu_get_libc_version") and hasattr(libc, "mallopt") else None


def return_large_blocks() -> bool:
    """Makes glibc map blocks of at least ``MMAP_THRESHOLD_BYTES`` on their own and trim its heap above
    ``TRIM_THRESHOLD_BYTES``, once for the process (later calls set the same values).

    Returns:
        True if both settings were applied; False on another C library, where mallopt refused, or
        where the user set ``MALLOC_MMAP_THRESHOLD_`` or ``MALLOC_TRIM_THRESHOLD_``.
    """
    if any(name in os.environ for name in USER_VARIABLES):
        return False
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
