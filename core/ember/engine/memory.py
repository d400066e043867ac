"""Hand heap memory that forward passes freed back to the OS once a model goes idle.

Why: glibc keeps freed blocks (a large batch's activations) in its arenas. A torch fp32
server holding 0.90 GiB resident after a burst of 32-sentence requests went back to
0.55 GiB after ``malloc_trim(0)``. A trim walks the heap, so the batcher runs it only after
it has been idle for a while, off the event loop.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)

IDLE_TRIM_SECONDS = 2.0


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def release_freed_memory() -> bool:
    """True when the C library gave memory back to the OS."""
    if _MALLOC_TRIM is None:
        return False
    released = bool(_MALLOC_TRIM(0))
    log.debug("malloc_trim: %s", "released memory" if released else "nothing to release")
    return released
