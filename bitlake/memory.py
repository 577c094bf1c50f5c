"""Giving memory back to the system after a large write.

pyarrow allocates from mimalloc, and numpy from the C library's heap: both keep the pages of freed buffers for
later allocations instead of returning them. After a large commit most of what it allocated is garbage, and the
process would stay at its peak, many times what it still uses, until both allocators give their free pages back,
which costs a fraction of a second (docs/benchmarks.md, "Design measurements", "Memory after a large write").
mimalloc collects the calling thread's pages: called from another thread, the collection freed nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

import pyarrow as pa

# A commit of at least this many records gives its freed memory back when it ends.
RELEASE_AFTER_RECORDS = 1_000_000


def release_unused() -> None:
    """Returns the freed memory of pyarrow's pool and of the C library's heap to the system: what this thread
    freed (the thread that dropped a table, not another)."""
    pa.default_memory_pool().release_unused()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None on a C library without it."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
