"""Data Change Events (LakeChime): what a commit tells the trigger service.

Each commit that changes the view carries its events inside the commit file, so an event exists iff
its commit does; a publisher registers them with the trigger service later, idempotently on
``(table, snapshot_id, partition)``. A writer killed between its commit and the registration loses
nothing: the next publisher run finds the unpublished commit.

One event per partition the commit touched (one with ``partition`` null for an unpartitioned table):
partitions of the rows it added and of the rows it invalidated.
"""

from __future__ import annotations

import datetime as dt

from bitlake.engine.metagen import Landed
from bitlake.format.commit import SegmentState
from bitlake.format.state import TableState

APPEND, DELETE, UPDATE = "APPEND", "DELETE", "UPDATE"


def operation_type(counts: dict[str, int]) -> str:
    if counts.get("updated", 0) == 0 and counts.get("deleted", 0) == 0:
        return APPEND
    if counts.get("inserted", 0) == 0 and counts.get("updated", 0) == 0:
        return DELETE
    return UPDATE


def commit_events(
    table: str,
    state: TableState,
    version: int,
    timestamp_ms: int,
    batches: list[Landed],
    segments: list[SegmentState],
    counts: dict[str, int],
) -> list[dict]:
    """The events of the commit that makes ``batches`` visible at ``version`` on top of ``state``."""
    meta = state.metadata
    partitions: set[tuple | None] = set()
    if not meta.partition_by:
        partitions.add(None)
    else:
        def key(partition: dict | None) -> tuple:
            partition = partition or {}
            return tuple(partition.get(c) for c in meta.partition_by)

        for b in batches:
            partitions.update(key(f.partition) for f in b.data_files)
        changed = {s.segment for s in segments if s.segment in state.segments
                   and state.segments[s.segment].cardinality != s.cardinality}
        partitions.update(key(f.partition) for f in state.data_files() if any(r.segment in changed for r in f.segments))
    stamp = dt.datetime.fromtimestamp(timestamp_ms / 1000, dt.UTC).isoformat()
    op = operation_type(counts)
    tags = {"batch_ids": ",".join(b.batch_id for b in batches)}
    return [
        {
            "table": table,
            "partition": list(p) if p is not None else None,
            "snapshot_id": str(version),
            "snapshot_ts": stamp,
            "prev_snapshot_id": str(state.last_event_version) if state.last_event_version else None,
            "table_format": "BITLAKE",
            "operation_type": op,
            "tags": tags,
        }
        for p in sorted(partitions, key=lambda p: () if p is None else tuple("" if v is None else v for v in p))
    ]
