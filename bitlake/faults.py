"""Named crash points for the crash-safety tests.

``BITLAKE_CRASH_AT=<point>`` makes the process SIGKILL itself when it reaches that point, the way a
killed writer dies: no exception handlers, no cleanup. Unset (always, outside tests) it costs a dict
lookup. The points are listed in :data:`POINTS`.
"""

from __future__ import annotations

import os
import signal

POINTS = (
    "after_claim",  # a segment part is claimed, nothing landed
    "after_landing",  # the input taken in, data files written or being written, no commit references them
    "after_metagen",  # logs, bitmaps and key-store files written, not committed
    "after_compaction_write",  # a compaction's files written, not committed
    "after_commit",  # the commit file exists; the writer never returns
    "in_index_update",  # committed; the key index holds the commit's entries but not yet its version
)


def point(name: str) -> None:
    if os.environ.get("BITLAKE_CRASH_AT") == name:
        os.kill(os.getpid(), signal.SIGKILL)
