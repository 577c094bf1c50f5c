"""Segment logs: the append-only validity events, in Parquet files shared by many segments
(docs/FORMAT.md, "Segment logs").

A row of a live segment is valid from its own delta value: the data implies it, so format v2 writes no
event for it. An event ``SET_VALID_UNTIL(row, t)`` ends its validity at event time ``t`` (``t`` =
:data:`~bitlake.format.metadata.DELTA_INFINITY` lifts an end again); the latest event of a row (by commit
version) wins. Format v1 files also hold ``SET_VALID_FROM`` events; v2 readers skip them.

Columns: the row id of the row the event is about; ``event``; ``t``, the delta value of the record that
caused it; ``cause``, that record's packed row id (an update is an UNTIL whose cause is a data row of the
same commit, a delete one whose cause is a delete record); ``batch_index``, the position among the batches
the commit made visible of the cause's batch. Within a file, events are sorted by row id, UNTIL events in
their own row groups. The commit that lists a file gives its events their version, except in a file a
compaction **regrouped** from several: it has a ``version`` column, each event's own commit version.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake.format import rowid
from bitlake.format.commit import LogFile
from bitlake.format.order import latest, lexsort, non_decreasing
from bitlake.format.rowid import OFFSET_COLUMN, PART_COLUMN, SEQ_COLUMN
from bitlake.fs import FileIO

SET_VALID_FROM = 1  # format v1 only
SET_VALID_UNTIL = 2

FILE_SCHEMA = pa.schema(
    [
        pa.field(PART_COLUMN, pa.int32(), False),
        pa.field(SEQ_COLUMN, pa.int32(), False),
        pa.field(OFFSET_COLUMN, pa.int32(), False),
        pa.field("event", pa.int8(), False),
        pa.field("t", pa.int64(), False),
        pa.field("cause", pa.int64(), False),
        pa.field("batch_index", pa.int32(), False),
    ]
)
VERSION = "version"
VERSIONED_SCHEMA = FILE_SCHEMA.append(pa.field(VERSION, pa.int64(), False))  # a regrouped file's


# Offsets ascend within a segment, and causes within a batch often do: DELTA_BINARY_PACKED stores them in a few
# bits where dictionaries of distinct values store several bytes a value (docs/benchmarks.md, "Design measurements",
# "Segment log encoding"); the columns with few distinct values keep dictionaries.
_DELTA_PACKED = (OFFSET_COLUMN, "t", "cause")
_PARQUET_OPTIONS = {
    "compression": "zstd",
    "use_dictionary": [n for n in VERSIONED_SCHEMA.names if n not in _DELTA_PACKED],
    "column_encoding": dict.fromkeys(_DELTA_PACKED, "DELTA_BINARY_PACKED"),
}


# Rows a row group of a log file (pyarrow's default), each taken in order as it is written.
_ROW_GROUP_ROWS = 1 << 20


def write_file(io: FileIO, path: str, events: pa.Table, order: np.ndarray | None = None) -> LogFile:
    """Writes ``events`` (columns of :data:`FILE_SCHEMA`, or :data:`VERSIONED_SCHEMA` for a regrouped file)
    sorted by row id (then version); returns the file's entry. ``order``: the permutation of ``events``, all
    SET_VALID_UNTIL, that sorts them, when the caller has it. The rows are taken in that order a row group at a
    time as they are written, not copied whole (the 5.7 M events of a 10 % upsert of TPC-H SF 10: 245 MB)."""
    schema = VERSIONED_SCHEMA if VERSION in events.column_names else FILE_SCHEMA
    table = events.select(schema.names).cast(schema)
    # UNTIL events first, each kind by row id (then version); events in that order already (a batch of updates
    # of a table loaded in key order) are not sorted again.
    not_until = table.column("event").to_numpy() != SET_VALID_UNTIL
    if order is None:
        rid = row_ids(table)
        if schema is VERSIONED_SCHEMA:
            order = lexsort((table.column(VERSION).to_numpy(), rid, not_until))
        elif not_until.any() or not non_decreasing(rid):
            order = lexsort((rid, not_until))
    until = table.num_rows - int(np.count_nonzero(not_until))
    with io.open_output(path) as out, pq.ParquetWriter(out, schema, **_PARQUET_OPTIONS) as writer:
        for start, end in ((0, until), (until, table.num_rows)):  # a kind's rows never share a row group
            for at in range(start, end, _ROW_GROUP_ROWS):
                n = min(_ROW_GROUP_ROWS, end - at)
                writer.write_table(table.slice(at, n) if order is None else table.take(order[at:at + n]))
    t = table.column("t")
    versions = None
    if schema is VERSIONED_SCHEMA:
        v = table.column(VERSION)
        versions = (pc.min(v).as_py(), pc.max(v).as_py())
    return LogFile(path, table.num_rows, io.size(path), pc.min(t).as_py(), pc.max(t).as_py(), versions=versions)


def read_until(io: FileIO, path: str, after: int | None = None, columns: list[str] | None = None,
               versioned: bool = False) -> pa.Table:
    """The SET_VALID_UNTIL events of a log file (with ``t > after`` when given); ``versioned``: a regrouped
    file, whose ``version`` column is read too."""
    filters = [("event", "=", SET_VALID_UNTIL)] + ([("t", ">", after)] if after is not None else [])
    return pq.read_table(io.open_input(path), filters=filters, columns=columns,
                         schema=VERSIONED_SCHEMA if versioned else FILE_SCHEMA)


def read_events(io: FileIO, listed: int, f: LogFile, after: int | None = None,
                columns: list[str] | None = None) -> tuple[pa.Table, np.ndarray]:
    """The SET_VALID_UNTIL events of log file ``f`` listed at version ``listed`` (``columns`` of them), and
    each one's commit version: the listing version, a regrouped file's own column, -1 in a folded file."""
    versioned = f.versions is not None
    wanted = None if columns is None else columns + [VERSION] * versioned
    events = read_until(io, f.path, after, wanted, versioned)
    if versioned:
        return events.drop_columns([VERSION]), events.column(VERSION).to_numpy()
    return events, np.full(events.num_rows, f.version_range(listed)[0], np.int64)


def row_ids(events: pa.Table) -> np.ndarray:
    """The packed row ids of the rows a table of events is about."""
    return rowid.pack_arrays(*(events.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))


def latest_until(io: FileIO, files: list[tuple[int, LogFile]], after: int | None = None,
                 with_version: bool = False) -> pa.Table:
    """The latest SET_VALID_UNTIL event per row among ``(listing version, file)`` pairs, as columns ``_row_id``
    (packed), ``t`` (and ``version``); the latest is the one of the highest version (docs/FORMAT.md, "Segment
    logs")."""
    ids, ts, versions = [], [], []
    for listed, f in files:
        events, of_events = read_events(io, listed, f, columns=[PART_COLUMN, SEQ_COLUMN, OFFSET_COLUMN, "t"])
        ids.append(row_ids(events))
        ts.append(events.column("t").to_numpy())
        versions.append(of_events)
    if not ids:
        empty = {"_row_id": pa.array([], pa.int64()), "t": pa.array([], pa.int64())}
        return pa.table({**empty, "version": pa.array([], pa.int64())} if with_version else empty)
    rid, t, v = np.concatenate(ids), np.concatenate(ts), np.concatenate(versions)
    pick = latest(rid, v)
    rid, t, v = rid[pick], t[pick], v[pick]
    if after is not None:
        keep = t > after
        rid, t, v = rid[keep], t[keep], v[keep]
    return pa.table({"_row_id": rid, "t": t, "version": v} if with_version else {"_row_id": rid, "t": t})
