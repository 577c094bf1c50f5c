"""Which version a read means, and which rows an event-time read brings back.

A version's current view needs no log replay: every MetaGen commit materialises the bitmaps of the
segments it touched, so the bitmaps named by the state at ``v`` are the view at ``v``.

An event-time view is derived from it. A row is valid at event time ``t`` as of version ``v`` iff it
was accepted by a commit ``<= v`` with its own delta ``<= t`` and not superseded by an accepted
record with delta ``<= t`` in a commit ``<= v``. The rows accepted as of ``v`` are the current view
plus the rows with a ``SET_VALID_UNTIL`` event in commits ``<= v``; hence::

    valid(v, t) = { r in current(v) : d_r <= t }  ∪  { r : UNTIL(r) in commits <= v, t_until > t, d_r <= t }

The second set comes from the log events after ``t`` only ("revived" rows), and log files record their
event-time range, so a read of a recent ``t`` opens only the recent log files.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from bitlake import commitlog, segmentlog
from bitlake.errors import InvalidInputError, VersionNotFoundError
from bitlake.fs import FileIO
from bitlake.rowid import OFFSET_COLUMN, PART_COLUMN, SEQ_COLUMN
from bitlake.state import TableState


def timestamp_ms(value: Any) -> int:
    """A commit-time argument (``as_of``) as milliseconds since the epoch."""
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise InvalidInputError(f"as_of {value!r} is not an ISO-8601 time") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return int(value.timestamp() * 1000)
    if isinstance(value, dt.date):
        return int(dt.datetime(value.year, value.month, value.day, tzinfo=dt.UTC).timestamp() * 1000)
    raise InvalidInputError(f"as_of must be a datetime, a date or an ISO-8601 string, not {value!r}")


def resolve_version(io: FileIO, latest: int, version: int | None = None, as_of: Any = None) -> int:
    """The version a read asks for: ``version``, or the latest commit at or before ``as_of``."""
    if version is not None and as_of is not None:
        raise InvalidInputError("give version or as_of, not both")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int):
            raise InvalidInputError(f"version must be an integer, not {version!r}")
        if not 0 <= version <= latest:
            raise VersionNotFoundError(f"version {version} does not exist; the table has versions 0 to {latest}")
        return version
    if as_of is None:
        return latest
    target = timestamp_ms(as_of)
    first = commitlog.read(io, 0).timestamp_ms
    if target < first:
        raise VersionNotFoundError(
            f"as_of {as_of} is before the table's first commit at "
            f"{dt.datetime.fromtimestamp(first / 1000, dt.UTC).isoformat()}"
        )
    # Commit timestamps strictly increase, so the answer is a binary search over the versions.
    lo, hi = 0, latest
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if commitlog.read(io, mid).timestamp_ms <= target:
            lo = mid
        else:
            hi = mid - 1
    return lo


def log_files_after(state: TableState, t: int) -> list[str]:
    """The log files (of commits up to the state's version) that may hold an event after ``t``."""
    return [f.path for _, f in state.logs if f.max_t > t]


def revived_offsets(io: FileIO, state: TableState, t: int) -> dict[tuple[int, int], np.ndarray]:
    """Per segment, the offsets of rows superseded only after event time ``t`` (driver-side)."""
    out: dict[tuple[int, int], list[np.ndarray]] = {}
    for path in log_files_after(state, t):
        events = pq.read_table(io.path(path), filters=[("event", "=", segmentlog.SET_VALID_UNTIL), ("t", ">", t)])
        parts = events.column(PART_COLUMN).to_numpy()
        seqs = events.column(SEQ_COLUMN).to_numpy()
        offsets = events.column(OFFSET_COLUMN).to_numpy()
        for part, seq in set(zip(parts.tolist(), seqs.tolist(), strict=True)):
            chosen = offsets[(parts == part) & (seqs == seq)]
            out.setdefault((part, seq), []).append(chosen)
    return {k: np.concatenate(v) for k, v in out.items()}
