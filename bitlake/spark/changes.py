"""The change feed: every accepted record committed in a version range, as rows with ``_change_type``,
``_commit_version`` and ``_commit_timestamp`` (Delta's change-data-feed names; docs/semantics.md, "Changes").

It is read from what the range's commits added, never from a diff of two views (docs/FORMAT.md, "Change
feed"). For a keyed table:

* the rows of the batches a commit made live are its new records; a new row is accepted unless it is stale,
  i.e. unless it is invalid at the end of the range without a SET_VALID_UNTIL event in the range (a row
  superseded later in the range was accepted first);
* an accepted new row that is the cause of a SET_VALID_UNTIL event of its commit is an ``update_postimage``,
  any other an ``insert``;
* the target of a SET_VALID_UNTIL event is an ``update_preimage`` when the event's cause is one of those new
  rows, a ``delete`` when it is a delete record.

Only the range's log files, the data files of its batches and the data files of the segments its events
name are read: the cost follows the change. Rows come out in commit order, then batch, delta value and cause.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bitlake.engine.plan import ReadPlan
from bitlake.format import bitmap, datafile, keystore, rowid, segmentlog
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


def read_changes(spark, io: FileIO, state: TableState, start: int, end: int, timestamps: dict[int, int],
                 change_types: list[str] | None = None):
    """Changes of commits ``(start, end]``; ``state`` is the state at ``end``; ``timestamps`` maps each
    version of the range to its commit time in milliseconds."""
    from pyspark.sql import functions as F

    from bitlake.spark.schema import spark_delta_as_long, spark_packed, spark_schema

    meta = state.metadata
    types = list(change_types or CHANGE_TYPES)
    columns = meta.column_names
    commit_timestamp = (F.element_at(F.expr(_sql_map(sorted(timestamps.items()))), F.col("_commit_version"))
                        / 1000).cast("timestamp").alias("_commit_timestamp")

    def empty():
        return spark.createDataFrame([], spark_schema(datafile.data_schema(meta))).select(
            *columns, F.lit(None).cast("string").alias("_change_type"),
            F.lit(None).cast("long").alias("_commit_version"), F.lit(None).cast("timestamp").alias("_commit_timestamp"),
        )

    live = {b.part: b for b in state.parts.values() if b.live_version is not None and start < b.live_version <= end}
    # A batch's index among the batches its commit made live, in the order they were applied.
    index_of = {}
    for v in sorted({b.live_version for b in live.values() if b.live_version is not None}):
        of_commit = sorted((b for b in live.values() if b.live_version == v), key=lambda b: (b.landed_version, b.part))
        index_of.update({b.part: i for i, b in enumerate(of_commit)})
    # A compacted file may hold rows of other batches beside the range's: those are dropped by part.
    new_files = [f for f in state.data_files() if any(r.part in live for r in f.segments)]
    part_col = F.col(rowid.PART_COLUMN)
    of_live = part_col.isin(sorted(live))
    version_of_part = F.element_at(F.expr(_sql_map((p, b.live_version) for p, b in live.items())), part_col)

    if not meta.keyed:
        if not new_files or "insert" not in types:
            return empty()
        index = F.element_at(F.expr(_sql_map(index_of.items())), part_col)
        df = scan(spark, io, meta, new_files).filter(of_live).select(
            *columns, F.lit("insert").alias("_change_type"), version_of_part.cast("long").alias("_commit_version"),
            index.alias("batch_index"), spark_packed().alias("_rid"))
        df = df.orderBy("_commit_version", "batch_index", "_rid")  # in order, as a keyed table's
        return df.select(*columns, "_change_type", "_commit_version", commit_timestamp)

    events = _events(io, state.logs, start, end)
    targets = events.column("_target").to_numpy()
    parts = []
    small = events.num_rows <= BROADCAST_EVENTS
    if new_files and {"insert", "update_postimage"} & set(types):
        # Stale rows: invalid at the end of the range and never superseded within it.
        new_segments = {r.segment for f in new_files for r in f.segments if r.part in live}
        p = ReadPlan(state, None, [], [], {k: state.segments[k] for k in new_segments if k in state.segments}, {})
        cache = bitmap.BitmapCache(io)
        stale = [
            np.setdiff1d(bitmap.invalid_offsets(p.kept(cache, k), s.offsets) | np.int64(rowid.segment_key(*k)), targets)
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
        wanted = {(s >> rowid.SEQ_BITS, s & rowid.MAX_SEQ)
                  for s in np.unique(ev.column("_target").to_numpy() >> rowid.OFFSET_BITS).tolist()}
        files = [f for f in state.data_files() if any(r.segment in wanted for r in f.segments)]
        if files and ev.num_rows:
            ev_df = spark.createDataFrame(ev)
            old = scan(spark, io, meta, files).withColumn("_target", spark_packed())
            parts.append(old.join(F.broadcast(ev_df) if small else ev_df, "_target").select(
                *columns, "_change_type", "_commit_version", "batch_index", "t", "cause"))
    if not parts:
        return empty()
    df = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    df = df.filter(F.col("_change_type").isin(types))
    order = F.element_at(F.create_map(*[F.lit(x) for kv in _ORDER.items() for x in kv]), F.col("_change_type"))
    keys = ["_commit_version", "batch_index", "t", "cause", order]
    rows = events.num_rows + sum(b.records for b in live.values())
    if rows <= SORT_IN_ONE_TASK_ROWS:
        df = df.repartition(1).sortWithinPartitions(*keys)
    else:
        df = df.repartition("_commit_version", "cause").orderBy(*keys)
    return df.select(*columns, "_change_type", "_commit_version", commit_timestamp)
