"""What a table's upkeep finds due (docs/maintenance.md, "Automatic upkeep"): the table's metrics, read from
the commit log and the bitmaps, never from the data, and the compactions and expiry they call for under the
``maintain.*`` and ``compact.*`` table properties."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from bitlake.engine.maintain import compaction, window
from bitlake.format import bitmap, commitlog
from bitlake.format.state import TableState
from bitlake.fs import FileIO

MINOR, MAJOR, CLEANUP = "compact", "compact_major", "cleanup"


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The figures upkeep decides by (and ``describe()`` reports)."""

    data_files: int
    small_files: int
    wasteful_files: int
    stored_rows: int
    valid_rows: int
    superseded_rows_read: int  # superseded rows in the files the current view reads (it filters them out)
    log_files: int
    log_files_before_window: int
    keystore_max_increments: int  # the most files any key-store bucket has
    pending_batches: int
    oldest_version: int  # the oldest version a read may still ask for (the window's start), and its commit time
    oldest_version_committed: str
    compactable_files: int  # what a minor compaction would rewrite now
    compactable_bytes: int
    regroupable_log_files: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Task:
    """One job due: what, why, and what it is expected to gain."""

    name: str
    reason: str
    gain: str

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


def metrics(io: FileIO, state: TableState) -> Metrics:
    files = compaction.metrics(bitmap.BitmapCache(io), state)
    meta = state.metadata
    groups = compaction.choose(files, meta.int_prop("compact.min_input_files"))
    start = state.window.version if state.window else 0
    return Metrics(
        data_files=len(state.files),
        small_files=sum(m.small for m in files),
        wasteful_files=sum(m.wasteful for m in files),
        stored_rows=sum(f.rows for f in state.files.values()),
        valid_rows=sum(s.cardinality for s in state.segments.values()),
        superseded_rows_read=round(sum(m.file.rows - m.valid_rows for m in files if m.valid_rows > 0)),
        log_files=len(state.logs),
        log_files_before_window=sum(1 for v, f in state.logs if f.version_range(v)[1] <= start and not f.folded),
        keystore_max_increments=max((len(v) for v in state.keystore.values()), default=0),
        pending_batches=len(state.pending),
        oldest_version=start,
        oldest_version_committed=dt.datetime.fromtimestamp(commitlog.read(io, start).timestamp_ms / 1000,
                                                           dt.UTC).isoformat(),
        compactable_files=sum(len(g) for g in groups),
        compactable_bytes=sum(m.file.bytes for g in groups for m in g),
        regroupable_log_files=len(compaction.regroupable(state)),
    )


def due(io: FileIO, state: TableState, m: Metrics) -> list[Task]:
    """The jobs ``m`` calls for, in the order to run them: a major compaction when the look-back
    (``compact.look_back``) would move the window by at least ``maintain.major_interval`` of commit time
    (it also does the minor compaction's work), else a minor one when files are worth rewriting; then cleanup,
    which removes what they replaced once the grace period has passed (it lists files, so it always runs)."""
    meta = state.metadata
    tasks = []
    interval = window.age_ms(meta.prop("maintain.major_interval"))
    current = state.window.version if state.window else 0
    start = window.start(io, state, meta.prop("compact.look_back"))
    moved_ms = commitlog.read(io, start).timestamp_ms - commitlog.read(io, current).timestamp_ms
    if start > current and (moved_ms >= interval or state.window is None):
        tasks.append(Task(MAJOR, f"the look-back {meta.prop('compact.look_back')!r} moves the window from version "
                                 f"{current} to {start}",
                          f"up to {m.stored_rows - m.valid_rows} superseded rows purged, "
                          f"{sum(1 for v, f in state.logs if f.version_range(v)[1] <= start and not f.folded)} "
                          f"log files folded; {m.compactable_files} files ({m.compactable_bytes} bytes) compacted"))
    elif m.compactable_files or m.regroupable_log_files:
        tasks.append(Task(MINOR, f"{m.small_files} small files, {m.wasteful_files} with superseded rows at least "
                                 f"{meta.prop('compact.invalid_fraction')} of theirs, {m.log_files} log files",
                          f"{m.compactable_files} files ({m.compactable_bytes} bytes) rewritten, the current view "
                          f"reading up to {m.superseded_rows_read} fewer superseded rows; "
                          f"{m.regroupable_log_files} log files regrouped into one"))
    tasks.append(Task(CLEANUP, "files no version inside the window reads", "their bytes, once older than the "
                                                                            "grace period"))
    return tasks
