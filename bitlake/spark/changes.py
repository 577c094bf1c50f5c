"""The change feed: every accepted record committed in a version range, as rows with
``_change_type``, ``_commit_version`` and ``_commit_timestamp`` (Delta's change-data-feed names).

It is read from the segment-log events of the range, never from a diff of two views. Events that
share a cause within one commit are an update: the UNTIL target is the preimage, the FROM target the
postimage. A FROM alone is an insert, an UNTIL alone a delete (its cause is a delete record). Stale
records and deletes of absent keys have no events and give nothing. Only the log files of the range
and the data files of the segments their events name are read: the cost follows the change.

Plan. The segments to read are found on the driver from the range's log files (two small integer
columns), without a Spark job. While the range has at most ``min(read.broadcast_invalid_rows,
BROADCAST_EVENTS)`` events (counted in the commit log), the events are broadcast to the data-file scan,
so the scanned rows are never shuffled, only the matching ones; the matches are then hash-partitioned
before the global sort, so the sort's sampling pass reads that small shuffle instead of scanning the
data files a second time (a range of at most ``SORT_IN_ONE_TASK_EVENTS`` events is sorted in one task
instead). Beyond that the join is Spark's choice (a shuffle join).
"""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq

from bitlake import rowid, segmentlog
from bitlake.fs import FileIO
from bitlake.schema import spark_schema
from bitlake.spark.landing import data_schema
from bitlake.spark.reader import scan
from bitlake.state import TableState

CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")
_ORDER = {"update_preimage": 0, "delete": 0, "insert": 1, "update_postimage": 1}
# Events of one range broadcast to the data-file scan at most (a few tens of bytes each once hashed).
BROADCAST_EVENTS = 2_000_000
# Ranges with at most this many events are sorted in a single task (one partition out).
SORT_IN_ONE_TASK_EVENTS = 100_000


def _sql_map(pairs) -> str:
    """A SQL ``map(...)`` literal of integer or hex-name keys and integer values: one expression for the
    JVM, however many entries (a Column per entry costs a Py4J round trip each)."""
    def lit(x):
        if isinstance(x, int):
            return str(x)
        return "'" + str(x).replace("\\", "\\\\").replace("'", "\\'") + "'"

    return "map(" + ", ".join(f"{lit(k)}, {lit(v)}" for k, v in pairs) + ")"


def _segments(io: FileIO, paths: list[str], types: list[str]) -> set[tuple[int, int]]:
    """The segments named by the events of ``paths`` that can give a wanted change type: SET_VALID_FROM
    targets for inserts and postimages, SET_VALID_UNTIL targets for preimages and deletes. A superset of
    the segments of the wanted rows (a FROM event may be a postimage when only inserts are wanted), read
    on the driver from the files' row-id columns in batches."""
    kinds = set()
    if {"insert", "update_postimage"} & set(types):
        kinds.add(segmentlog.SET_VALID_FROM)
    if {"update_preimage", "delete"} & set(types):
        kinds.add(segmentlog.SET_VALID_UNTIL)
    found: set[tuple[int, int]] = set()
    columns = [rowid.PART_COLUMN, rowid.SEQ_COLUMN, "event"]
    for path in paths:
        for b in pq.ParquetFile(io.path(path)).iter_batches(columns=columns, batch_size=1 << 20):
            part = b.column(0).to_numpy().astype(np.int64)
            seq = b.column(1).to_numpy().astype(np.int64)
            keep = np.isin(b.column(2).to_numpy(), list(kinds))
            keys = np.unique((part[keep] << 32) | seq[keep])
            found.update((int(k >> 32), int(k & 0xFFFFFFFF)) for k in keys)
    return found


def read_changes(spark, io: FileIO, state: TableState, start: int, end: int, timestamps: dict[int, int],
                 change_types: list[str] | None = None):
    """Changes of commits ``(start, end]``; ``state`` is the state at ``end``; ``timestamps`` maps each
    version of the range to its commit time in milliseconds."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    meta = state.metadata
    types = list(change_types or CHANGE_TYPES)
    columns = meta.column_names
    stamp = F.expr(_sql_map(sorted(timestamps.items())))
    millis = F.element_at(stamp, F.col("_commit_version"))
    commit_timestamp = (millis / 1000).cast("timestamp").alias("_commit_timestamp")

    def finish(df):
        df = df.withColumn("_commit_timestamp", commit_timestamp)
        return df.filter(F.col("_change_type").isin(types))

    def empty():
        return spark.createDataFrame([], spark_schema(data_schema(meta))).select(
            *columns, F.lit(None).cast("string").alias("_change_type"),
            F.lit(None).cast("long").alias("_commit_version"), F.lit(None).cast("timestamp").alias("_commit_timestamp"),
        )

    if not meta.keyed:
        # Append-only: the range's changes are the rows of the batches it made visible.
        files = [f for f in state.data_files() if start < state.visible_parts[f.segment_part] <= end]
        if not files:
            return empty()
        version_of = F.create_map(
            *[F.lit(x) for part in sorted({f.segment_part for f in files}) for x in (part, state.visible_parts[part])]
        )
        df = scan(spark, io, state, files).select(
            *columns, F.lit("insert").alias("_change_type"),
            F.element_at(version_of, F.col(rowid.PART_COLUMN)).cast("long").alias("_commit_version"),
        )
        return finish(df)

    logs = [(v, f) for v, f in state.logs if start < v <= end]
    if not logs:
        return empty()
    # Log files have unique (uuid) names; the commit that lists a file gives its events their version.
    version_of_file = F.expr(_sql_map((f.path.rsplit("/", 1)[-1], v) for v, f in logs))
    events = (
        spark.read.schema(segmentlog.FILE_SCHEMA_DDL).parquet(*[io.path(f.path) for _, f in logs])
        .withColumn("_commit_version", F.element_at(version_of_file, F.element_at(
            F.split(F.col("_metadata.file_path"), "/"), -1)).cast("long"))
    )
    same_cause = Window.partitionBy("_commit_version", "cause")
    events = events.withColumn("_n", F.count(F.lit(1)).over(same_cause)).select(
        rowid.spark_packed().alias("_target"),
        F.when(F.col("event") == segmentlog.SET_VALID_FROM,
               F.when(F.col("_n") > 1, "update_postimage").otherwise("insert"))
        .otherwise(F.when(F.col("_n") > 1, "update_preimage").otherwise("delete")).alias("_change_type"),
        "_commit_version", "batch_index", "t", "cause",
    ).filter(F.col("_change_type").isin(types))
    # Only the data files of the segments the wanted events name are read.
    wanted = _segments(io, [f.path for _, f in logs], types)
    files = [f for f in state.data_files() if f.segment in wanted]
    if not files:
        return empty()
    events_count = sum(f.events for _, f in logs)
    broadcast = events_count <= min(meta.int_prop("read.broadcast_invalid_rows"), BROADCAST_EVENTS)
    if broadcast:
        events = F.broadcast(events)
    rows = scan(spark, io, state, files).withColumn("_target", rowid.spark_packed())
    df = rows.join(events, "_target")
    order = F.expr(_sql_map(_ORDER.items()))
    keys = ["_commit_version", "batch_index", "t", "cause", F.element_at(order, F.col("_change_type"))]
    if events_count <= SORT_IN_ONE_TASK_EVENTS:
        # A small change is sorted in one task: one exchange of the matching rows, no sampling pass.
        df = df.repartition(1).sortWithinPartitions(*keys)
    elif broadcast:
        # Without a shuffle below it, the sort's range-partitioning sample would scan the files again.
        df = df.repartition("_commit_version", "cause").orderBy(*keys)
    else:
        df = df.orderBy(*keys)
    return df.select(*columns, "_change_type", "_commit_version", commit_timestamp)
