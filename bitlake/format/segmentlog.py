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
their own row groups. The commit that lists a file gives its events their version.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake.format import rowid
from bitlake.format.commit import LogFile
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


# Offsets ascend within a segment, and causes within a batch often do: DELTA_BINARY_PACKED stores them in a few
# bits where dictionaries of distinct values store ~5 bytes (a 1 % upsert of TPC-H lineitem SF 1: 0.19 MB
# against 0.54 MB); the columns with few distinct values keep dictionaries.
_DELTA_PACKED = (OFFSET_COLUMN, "t", "cause")
_PARQUET_OPTIONS = {
    "compression": "zstd",
    "use_dictionary": [n for n in FILE_SCHEMA.names if n not in _DELTA_PACKED],
    "column_encoding": dict.fromkeys(_DELTA_PACKED, "DELTA_BINARY_PACKED"),
}


def write_file(io: FileIO, path: str, events: pa.Table) -> LogFile:
    """Writes ``events`` (columns of :data:`FILE_SCHEMA`) sorted by row id; returns the file's entry."""
    table = events.cast(FILE_SCHEMA)
    table = table.take(pc.sort_indices(table, sort_keys=[
        (PART_COLUMN, "ascending"), (SEQ_COLUMN, "ascending"), (OFFSET_COLUMN, "ascending"),
    ]))
    with io.open_output(path) as out, pq.ParquetWriter(out, FILE_SCHEMA, **_PARQUET_OPTIONS) as writer:
        for kind in (SET_VALID_UNTIL, SET_VALID_FROM):
            of_kind = table.filter(pc.equal(table.column("event"), kind))
            if of_kind.num_rows:
                writer.write_table(of_kind)
    t = table.column("t")
    return LogFile(path, table.num_rows, io.size(path), pc.min(t).as_py(), pc.max(t).as_py())


def read_until(io: FileIO, path: str, after: int | None = None, columns: list[str] | None = None) -> pa.Table:
    """The SET_VALID_UNTIL events of a log file (with ``t > after`` when given)."""
    filters = [("event", "=", SET_VALID_UNTIL)] + ([("t", ">", after)] if after is not None else [])
    return pq.read_table(io.open_input(path), filters=filters, columns=columns, schema=FILE_SCHEMA)


def row_ids(events: pa.Table) -> np.ndarray:
    """The packed row ids of the rows a table of events is about."""
    return rowid.pack_arrays(*(events.column(c).to_numpy() for c in rowid.ROW_ID_COLUMNS))


def latest(rid: np.ndarray, versions: np.ndarray) -> np.ndarray:
    """Indices of each row's latest event (the one of the highest version; the first of a tie), in row-id order."""
    order = np.lexsort((-versions, rid))
    first = np.ones(len(order), dtype=bool)
    first[1:] = rid[order][1:] != rid[order][:-1]
    return order[first]


def latest_until(io: FileIO, files: list[tuple[int, LogFile]], after: int | None = None,
                 with_version: bool = False) -> pa.Table:
    """The latest SET_VALID_UNTIL event per row among ``(version, file)`` pairs, as columns ``_row_id``
    (packed), ``t`` (and ``version``); the latest is the one of the highest version (docs/FORMAT.md, "Segment
    logs")."""
    ids, ts, versions = [], [], []
    for version, f in files:
        events = read_until(io, f.path, columns=[PART_COLUMN, SEQ_COLUMN, OFFSET_COLUMN, "t"])
        packed = row_ids(events)
        ids.append(packed)
        ts.append(events.column("t").to_numpy())
        versions.append(np.full(len(packed), version, np.int64))
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
