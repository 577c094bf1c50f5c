"""Data Change Events (LakeChime): what a commit tells the trigger service.

Each commit that changes the view carries its events inside the commit file, so an event exists iff
its commit does; a publisher registers them with the trigger service later, idempotently on
``(table, snapshot_id, partition)``. A writer killed between its commit and the registration loses
nothing: the next publisher run finds the unpublished commit.

One event per partition the commit touched (one with ``partition`` null for an unpartitioned table): the
partitions of the rows whose validity it changed, the rows it made valid and those it invalidated (a stale
record touches no partition). A commit that changed no row has no event.
"""

from __future__ import annotations

import datetime as dt
import json

from pyroaring import BitMap

from bitlake.engine.write.landing import Landed
from bitlake.format import bitmap, datafile, rowid
from bitlake.format.commit import DataFile, SegmentState
from bitlake.format.state import TableState
from bitlake.fs import FileIO

APPEND, DELETE, UPDATE = "APPEND", "DELETE", "UPDATE"
# The rows of landed files a commit reads (their row-id columns) to find which partitions hold the rows whose
# validity it changed; beyond it, the other files of a changed segment name their partitions unread.
READ_BUDGET_ROWS = 4_000_000


def operation_type(counts: dict[str, int]) -> str:
    if counts.get("updated", 0) == 0 and counts.get("deleted", 0) == 0:
        return APPEND
    if counts.get("inserted", 0) == 0 and counts.get("updated", 0) == 0:
        return DELETE
    return UPDATE


def commit_events(
    io: FileIO,
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
        if any(counts.get(k, 0) for k in ("inserted", "updated", "deleted")):
            partitions.add(None)  # else only stale records and deletes of absent keys: no row changed
    else:
        files = [*state.data_files(), *(f for b in batches for f in b.data_files)]
        partitions.update(tuple((f.partition or {}).get(c) for c in meta.partition_by)
                          for f in _touched(io, state, files, segments))
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


def _touched(io: FileIO, state: TableState, files: list[DataFile], segments: list[SegmentState]) -> list[DataFile]:
    """The files among ``files`` holding a row whose validity the new segment states ``segments`` change (a row
    that became valid or stopped being valid): a stale record or an update of another partition's row leaves a
    partition untouched, although its segment's bitmap changed."""
    cache = bitmap.BitmapCache(io)
    flipped: dict[tuple[int, int], BitMap] = {}
    for s in segments:
        old = state.segments.get(s.segment)
        holes_old, universe_old = cache.holes(old) if old is not None else (BitMap(), 0)
        holes_new, universe_new = cache.holes(s)
        universe = max(universe_old, universe_new)
        holes_old.add_range(universe_old, universe)  # offsets past a universe are not valid
        holes_new.add_range(universe_new, universe)
        flips = holes_old ^ holes_new
        if flips:
            flipped[s.segment] = flips
    holding: dict[tuple[int, int], list[DataFile]] = {}
    for f in files:
        for r in f.segments:
            if r.segment in flipped:
                holding.setdefault(r.segment, []).append(f)
    out: dict[str, DataFile] = {}
    budget = READ_BUDGET_ROWS
    for segment, among in holding.items():
        if len({json.dumps(f.partition, sort_keys=True) for f in among}) == 1:
            out.update((f.path, f) for f in among[:1])  # one partition holds the segment: no file to read
            continue
        for f in among:
            if f.path in out:
                continue
            if f.offsets is None:
                budget -= f.rows
            if budget < 0 or _holds(io, state, f, segment, flipped[segment], cache):
                out[f.path] = f  # past the budget, a landed file's partition is named without reading it
    return list(out.values())


def _holds(io: FileIO, state: TableState, f: DataFile, segment: tuple[int, int], offsets: BitMap,
           cache: bitmap.BitmapCache) -> bool:
    """Whether data file ``f`` holds one of ``offsets`` of ``segment``: a compacted file's offsets file says; a
    landed file's row-id columns do."""
    if f.offsets is not None:
        return bool(cache.file(f.offsets)[segment] & offsets)
    ids = datafile.read_data(io, f.path, state.metadata, columns=list(rowid.ROW_ID_COLUMNS))
    at = ids.column(rowid.OFFSET_COLUMN).to_numpy()
    if len(f.segments) > 1:
        mine = (ids.column(rowid.PART_COLUMN).to_numpy() == segment[0]) & (
            ids.column(rowid.SEQ_COLUMN).to_numpy() == segment[1])
        at = at[mine]
    return bool(bitmap.valid_mask(offsets, at).any())
