"""Named fault points on the write path, for the crash-safety and fault tests.

``BITLAKE_CRASH_AT=<point>`` makes the process SIGKILL itself when it reaches that point, the way a killed
writer dies: no exception handlers, no cleanup. :func:`inject` makes the point raise an exception (or a
``KeyboardInterrupt``) in this process instead. Unset (always, outside tests) a point costs a dict lookup.
The points are listed in :data:`POINTS`.
"""

from __future__ import annotations

import contextlib
import os
import signal

POINTS = (
    "after_claim",  # a segment part is claimed, nothing landed
    "after_landing",  # the input taken in, data files written or being written, no commit references them
    "after_compaction_write",  # a compaction's files written, not committed
    "before_commit",  # every file of the commit written, the commit not put
    "after_commit",  # the commit file exists; the writer has not learned it
    "after_checkpoint",  # committed (and checkpointed when due); the steps after the commit not run
    "in_index_update",  # committed; the key index holds the commit's entries but not yet its version
    "after_commit_steps",  # committed, the commit's own steps done; the upkeep after it not run
    "in_cleanup",  # cleanup deleted a file and has more to delete
)

# Names points had before (BITLAKE_CRASH_AT=after_metagen keeps working).
ALIASES = {"after_metagen": "before_commit"}
_injected: dict[str, BaseException] = {}


def point(name: str) -> None:
    crash_at = os.environ.get("BITLAKE_CRASH_AT")
    if crash_at is not None and ALIASES.get(crash_at, crash_at) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if _injected:
        error = _injected.pop(name, None)
        if error is not None:
            raise error


@contextlib.contextmanager
def inject(name: str, error: BaseException):
    """Within the block, the first time point ``name`` is reached it raises ``error``."""
    if name not in POINTS:
        raise ValueError(f"unknown fault point {name!r}; known: {POINTS}")
    _injected[name] = error
    try:
        yield
    finally:
        _injected.pop(name, None)
