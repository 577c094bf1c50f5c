"""The memory this process may use, and giving memory back to the system after a large write.

A process in a container may use what its control group allows, which can be far less than the machine has:
:func:`usable_bytes` is the smaller of the two, so that what bitlake sizes by memory (the key-store cache) stays
within a container's limit instead of being killed at it.

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
import os

import pyarrow as pa

# A commit of at least this many records gives its freed memory back when it ends.
RELEASE_AFTER_RECORDS = 1_000_000


# cgroup v1 reports "no limit" as the largest multiple of the page size below 2**63.
_NO_LIMIT = 1 << 62


def usable_bytes(root: str = "/sys/fs/cgroup", cgroups: str = "/proc/self/cgroup") -> int | None:
    """The memory this process may use: the machine's, or less when its control group (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``, of its own group or of any group above it) sets a lower limit. None when neither
    is known."""
    limits = [_physical_bytes()]
    try:
        with open(cgroups) as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2: one hierarchy
            limits += _limits(root, path, "memory.max")
        elif "memory" in controllers.split(","):
            limits += _limits(os.path.join(root, "memory"), path, "memory.limit_in_bytes")
    known = [n for n in limits if n is not None]
    return min(known) if known else None


def _limits(mount: str, path: str, name: str) -> list[int | None]:
    """The limits ``name`` sets on group ``path`` and every group above it, under ``mount`` (a container sees its
    own group as the root, or under the path the host gave it)."""
    out: list[int | None] = []
    parts = [p for p in path.split("/") if p]
    for depth in range(len(parts), -1, -1):
        try:
            with open(os.path.join(mount, *parts[:depth], name)) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text != "max" and text.isdigit() and int(text) < _NO_LIMIT:
            out.append(int(text))
    return out


def _physical_bytes() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - systems without sysconf
        return None


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
