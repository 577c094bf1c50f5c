"""The change feed: every accepted record committed in a version range, as rows with ``_change_type``,
``_commit_version`` and ``_commit_timestamp`` (Delta's change-data-feed names; docs/semantics.md, "Changes").

It is read from what the range's commits added, never from a diff of two views (docs/FORMAT.md, "Change
feed"). For a keyed table:

* the rows of the batches a commit made live are its new records; a new row is accepted unless it is stale,
  i.e. unless it is invalid in the segment state its commit wrote without a SET_VALID_UNTIL event of that
  commit (a row superseded in its own commit was accepted first);
* an accepted new row that is the cause of a SET_VALID_UNTIL event of its commit is an ``update_postimage``,
  any other an ``insert``;
* the target of a SET_VALID_UNTIL event is an ``update_preimage`` when the event's cause is one of those new
  rows, a ``delete`` when it is a delete record;
* a restatement commit (one with change files: a revert, a replace, a vacuum, an unkeyed table's delete or
  update) has its change rows in its change files instead: none of the above applies to it.

Only the range's log files, the data files of its batches and the data files of the segments its events
name are read: the cost follows the change. Rows come out in commit order, then batch, delta value and cause.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.engine.plan import ReadPlan
from bitlake.format import bitmap, changefile, datafile, keystore, rowid, segmentlog
from bitlake.format.commit import Commit
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.spark.reader import scan

CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")
_ORDER = {"update_preimage": 0, "delete": 0, "insert": 1, "update_postimage": 1}
# Events of one range broadcast to the data-file scans at most (a few tens of bytes each).
BROADCAST_EVENTS = 2_000_000
# Ranges with at most this many change rows are sorted in a single task (one partition out).
SORT_IN_ONE_TASK_ROWS = 100_000


def _sql_map(pairs) -> str:
    """A SQL ``map(...)`` literal of integer keys and values: one expression for the JVM, however many
    entries (a Column per entry costs a Py4J round trip each)."""
    return "map(" + ", ".join(f"{int(k)}, {int(v)}" for k, v in pairs) + ")"


def _events(io: FileIO, logs, start: int, end: int) -> pa.Table:
    """The SET_VALID_UNTIL events of commits ``(start, end]`` in the ``(listing version, file)`` pairs, read
    on the driver: packed target, t, cause, batch index, version. A folded log (major compaction) holds events
    of versions up to the window's start, which no range reaches; a regrouped one, events of several commits."""
    pieces = []
    for listed, f in logs:
        first, last = f.version_range(listed)
        if f.folded or last <= start or first > end:
            continue
        e, versions = segmentlog.read_events(io, listed, f)
        keep = (versions > start) & (versions <= end)
        if not keep.all():
            e, versions = e.filter(pa.array(keep)), versions[keep]
        pieces.append(pa.table({
            "_target": segmentlog.row_ids(e), "t": e.column("t"), "cause": e.column("cause"),
            "batch_index": e.column("batch_index"), "_commit_version": pa.array(versions),
        }))
    if not pieces:
        return pa.table({"_target": pa.array([], pa.int64()), "t": pa.array([], pa.int64()),
                         "cause": pa.array([], pa.int64()), "batch_index": pa.array([], pa.int32()),
                         "_commit_version": pa.array([], pa.int64())})
    return pa.concat_tables(pieces)


def read_changes(spark, io: FileIO, state: TableState, start: int, end: int, commits: dict[int, Commit],
                 change_types: list[str] | None = None):
    """Changes of commits ``(start, end]``; ``state`` is the state at ``end``; ``commits`` holds each commit
    of the range."""
    from pyspark.sql import functions as F

    from bitlake.spark.schema import spark_packed, spark_schema

    meta = state.metadata
    types = list(change_types or CHANGE_TYPES)
    columns = meta.column_names
    timestamps = {v: c.timestamp_ms for v, c in commits.items()}
    restated = {v for v, c in commits.items() if c.change_files}
    commit_timestamp = (F.element_at(F.expr(_sql_map(sorted(timestamps.items()))), F.col("_commit_version"))
                        / 1000).cast("timestamp").alias("_commit_timestamp")

    def empty():
        return spark.createDataFrame([], spark_schema(datafile.data_schema(meta))).select(
            *columns, F.lit(None).cast("string").alias("_change_type"),
            F.lit(None).cast("long").alias("_commit_version"), F.lit(None).cast("timestamp").alias("_commit_timestamp"),
        )

    live = {b.part: b for b in state.parts.values() if b.live_version is not None and start < b.live_version <= end
            and b.live_version not in restated}
    # A batch's index among the batches its commit made live, in the order they were applied.
    index_of = {}
    for v in sorted({b.live_version for b in live.values() if b.live_version is not None}):
        of_commit = sorted((b for b in live.values() if b.live_version == v), key=lambda b: (b.landed_version, b.part))
        index_of.update({b.part: i for i, b in enumerate(of_commit)})
    # A compacted file may hold rows of other batches beside the range's: those are dropped by part.
    new_files = [f for f in state.data_files() if any(r.part in live for r in f.segments)]

    parts = []
    rows = sum(b.records for b in live.values())
    if not meta.keyed:
        if new_files and "insert" in types:
            part_col = F.col(rowid.PART_COLUMN)
            version_of_part = F.element_at(F.expr(_sql_map((p, b.live_version) for p, b in live.items())), part_col)
            index = F.element_at(F.expr(_sql_map(index_of.items())), part_col)
            parts.append(scan(spark, io, meta, new_files).filter(part_col.isin(sorted(live))).select(
                *columns, F.lit("insert").alias("_change_type"), version_of_part.cast("long").alias("_commit_version"),
                index.cast("int").alias("batch_index"), F.lit(0).cast("long").alias("t"),
                spark_packed().alias("cause")))
        events = _events(io, [], start, end)
    else:
        events = _events(io, state.logs, start, end)
        if restated:
            events = events.filter(pa.array(~np.isin(events.column("_commit_version").to_numpy(), sorted(restated))))
        parts += _keyed(spark, io, state, commits, live, index_of, new_files, events, types)
    parts += _restated(spark, io, state, commits, restated, types)
    if not parts:
        return empty()
    df = parts[0]
    for more in parts[1:]:
        df = df.unionByName(more)
    df = df.filter(F.col("_change_type").isin(types))
    order = F.element_at(F.create_map(*[F.lit(x) for kv in _ORDER.items() for x in kv]), F.col("_change_type"))
    keys = ["_commit_version", "batch_index", "t", "cause", order]
    rows += events.num_rows + sum(f.rows for v in restated for f in commits[v].change_files)
    if rows <= SORT_IN_ONE_TASK_ROWS:
        df = df.repartition(1).sortWithinPartitions(*keys)
    else:
        df = df.repartition("_commit_version", "cause").orderBy(*keys)
    return df.select(*columns, "_change_type", "_commit_version", commit_timestamp)


def _keyed(spark, io: FileIO, state: TableState, commits: dict[int, Commit], live: dict, index_of: dict,
           new_files: list, events: pa.Table, types: list[str]) -> list:
    """The change rows a keyed table's commits derive from their new rows and their events."""
    from pyspark.sql import functions as F

    from bitlake.spark.schema import spark_delta_as_long, spark_packed

    meta = state.metadata
    columns = meta.column_names
    part_col = F.col(rowid.PART_COLUMN)
    of_live = part_col.isin(sorted(live))
    version_of_part = F.element_at(F.expr(_sql_map((p, b.live_version) for p, b in live.items())), part_col)
    targets = events.column("_target").to_numpy()
    parts = []
    small = events.num_rows <= BROADCAST_EVENTS
    if new_files and {"insert", "update_postimage"} & set(types):
        # Stale rows: invalid in the segment state their own commit wrote, and not superseded in that commit.
        of_own = _of_own_commit(events, live)
        new_segments = {r.segment for f in new_files for r in f.segments if r.part in live}
        own = _own_segments(state, commits, live, new_segments)
        p = ReadPlan(state, None, [], [], own, {})
        cache = bitmap.BitmapCache(io)
        stale = [
            np.setdiff1d(bitmap.invalid_offsets(p.kept(cache, k), s.offsets) | np.int64(rowid.segment_key(*k)),
                         targets[of_own])
            for k, s in p.segments.items()
        ]
        stale_ids = np.concatenate(stale) if stale else np.empty(0, np.int64)
        new = scan(spark, io, meta, new_files).filter(of_live).withColumn("_rid", spark_packed())
        if len(stale_ids):
            drop = spark.createDataFrame(pa.table({"_stale": stale_ids}))
            new = new.join(F.broadcast(drop) if len(stale_ids) <= BROADCAST_EVENTS else drop,
                           F.col("_rid") == F.col("_stale"), "left_anti")
        new = new.withColumn("_commit_version", version_of_part.cast("long")).withColumn(
            "batch_index", F.element_at(F.expr(_sql_map(index_of.items())), part_col).cast("int"))
        causes = spark.createDataFrame(pa.table({"_cause": np.unique(events.column("cause").to_numpy())}))
        causes = F.broadcast(causes) if small else causes
        is_update = F.col("_cause").isNotNull()
        parts.append(
            new.join(causes, F.col("_rid") == F.col("_cause"), "left").select(
                *columns, F.when(is_update, "update_postimage").otherwise("insert").alias("_change_type"),
                "_commit_version", "batch_index", spark_delta_as_long(meta).alias("t"), F.col("_rid").alias("cause"))
        )
    if events.num_rows and {"update_preimage", "delete"} & set(types):
        # An event whose cause is a delete record is a delete, any other an update's preimage: the delete
        # records are in the keys files of the batches the range made live (a few bytes a record).
        deletes = [datafile.read_keys(io, f.path, meta).filter(pc.field(keystore.DELETED)).column(keystore.ROW_ID)
                   for b in live.values() for f in b.keys_files]
        is_delete = np.isin(events.column("cause").to_numpy(), np.concatenate([d.to_numpy() for d in deletes])
                            if deletes else np.empty(0, np.int64))
        kinds = pa.array(np.where(is_delete, "delete", "update_preimage"))
        ev = events.append_column("_change_type", kinds).filter(pc.is_in(kinds, pa.array(types)))
        if ev.num_rows:
            parts += _rows_of(spark, io, state, ev.select(["_target", "_change_type", "_commit_version", "batch_index",
                                                           "t", "cause"]), small)
    return parts


def _of_own_commit(events: pa.Table, live: dict) -> np.ndarray:
    """A mask of the events committed with the batch of the row they end (a row superseded in its own commit)."""
    if not events.num_rows or not live:
        return np.zeros(events.num_rows, dtype=bool)
    parts = np.array(sorted(live), dtype=np.int64)
    versions = np.array([live[p].live_version for p in parts.tolist()], dtype=np.int64)
    target_part = events.column("_target").to_numpy() >> rowid.PART_SHIFT
    pos = np.minimum(np.searchsorted(parts, target_part), len(parts) - 1)
    return (parts[pos] == target_part) & (versions[pos] == events.column("_commit_version").to_numpy())


def _own_segments(state: TableState, commits: dict[int, Commit], live: dict, segments: set) -> dict:
    """The states of ``segments`` as the commits that made their batches live wrote them (a later restatement
    may have changed them since); the state's where a commit does not list one (a translated v1 commit)."""
    out = {}
    for v in sorted({live[k[0]].live_version for k in segments}):
        out.update({s.segment: s for s in commits[v].segments if s.segment in segments
                    and live[s.part].live_version == v})
    return {k: out.get(k) or state.segments[k] for k in segments if k in out or k in state.segments}


def _restated(spark, io: FileIO, state: TableState, commits: dict[int, Commit], restated: set[int],
              types: list[str]) -> list:
    """The change rows of restatement commits, from their change files."""
    pieces, carried = [], []
    meta = state.metadata
    for v in sorted(restated):
        for f in commits[v].change_files:
            rows = changefile.read(io, f)
            if changefile.carries_values(rows):  # rows no data file holds (a vacuum's deletes): read from it
                rows = rows.filter(pc.is_in(rows.column(changefile.CHANGE_TYPE), pa.array(types)))
                n = rows.num_rows
                columns = {c: rows.column(c) if c in rows.column_names else pa.nulls(n, meta.schema.field(c).type)
                           for c in meta.column_names}
                carried.append(pa.table({
                    **columns, "_change_type": rows.column(changefile.CHANGE_TYPE),
                    "_commit_version": pa.array(np.full(n, v, np.int64)),
                    "batch_index": pa.array(np.zeros(n, np.int32)), "t": rows.column(changefile.ORDER),
                    "cause": pa.array(np.zeros(n, np.int64)),
                }).cast(pa.schema([*(meta.schema.field(c) for c in meta.column_names),
                                   pa.field("_change_type", pa.string()), pa.field("_commit_version", pa.int64()),
                                   pa.field("batch_index", pa.int32()), pa.field("t", pa.int64()),
                                   pa.field("cause", pa.int64())])))
                continue
            pieces.append(pa.table({
                "_target": rows.column(changefile.ROW_ID), "_change_type": rows.column(changefile.CHANGE_TYPE),
                "_commit_version": pa.array(np.full(rows.num_rows, v, np.int64)),
                "batch_index": pa.array(np.zeros(rows.num_rows, np.int32)), "t": rows.column(changefile.ORDER),
                "cause": pa.array(np.zeros(rows.num_rows, np.int64)),
            }))
    out = [spark.createDataFrame(t) for t in carried if t.num_rows]
    if not pieces:
        return out
    rows = pa.concat_tables(pieces)
    rows = rows.filter(pc.is_in(rows.column("_change_type"), pa.array(types)))
    return out + (_rows_of(spark, io, state, rows, rows.num_rows <= BROADCAST_EVENTS) if rows.num_rows else [])


def _rows_of(spark, io: FileIO, state: TableState, wanted: pa.Table, small: bool) -> list:
    """The change rows ``wanted`` (``_target`` row ids and the change columns) with the values of their rows."""
    from pyspark.sql import functions as F

    from bitlake.spark.schema import spark_packed

    segments = {(s >> rowid.SEQ_BITS, s & rowid.MAX_SEQ)
                for s in np.unique(wanted.column("_target").to_numpy() >> rowid.OFFSET_BITS).tolist()}
    files = [f for f in state.data_files() if any(r.segment in segments for r in f.segments)]
    if not files:
        return []
    df = spark.createDataFrame(wanted)
    old = scan(spark, io, state.metadata, files).withColumn("_target", spark_packed())
    return [old.join(F.broadcast(df) if small else df, "_target").select(
        *state.metadata.column_names, "_change_type", "_commit_version", "batch_index", "t", "cause")]
