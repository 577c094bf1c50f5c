"""The change feed: every accepted record committed in a version range, as rows with
``_change_type``, ``_commit_version`` and ``_commit_timestamp`` (Delta's change-data-feed names).

It is read from the segment-log events of the range, never from a diff of two views. Events that
share a cause within one commit are an update: the UNTIL target is the preimage, the FROM target the
postimage. A FROM alone is an insert, an UNTIL alone a delete (its cause is a delete record). Stale
records and deletes of absent keys have no events and give nothing. Only the log files of the range
and the data files of the segments their events name are read: the cost follows the change.
"""

from __future__ import annotations

from bitlake import rowid, segmentlog
from bitlake.fs import FileIO
from bitlake.schema import spark_schema
from bitlake.spark.landing import data_schema
from bitlake.spark.reader import scan
from bitlake.state import TableState

CHANGE_TYPES = ("insert", "update_preimage", "update_postimage", "delete")
_ORDER = {"update_preimage": 0, "delete": 0, "insert": 1, "update_postimage": 1}


def read_changes(spark, io: FileIO, state: TableState, start: int, end: int, timestamps: dict[int, int],
                 change_types: list[str] | None = None):
    """Changes of commits ``(start, end]``; ``state`` is the state at ``end``; ``timestamps`` maps each
    version of the range to its commit time in milliseconds."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    meta = state.metadata
    types = list(change_types or CHANGE_TYPES)
    columns = meta.column_names
    stamp = F.create_map(*[F.lit(x) for v, ms in sorted(timestamps.items()) for x in (v, ms)])

    def finish(df):
        millis = F.element_at(stamp, F.col("_commit_version"))
        df = df.withColumn("_commit_timestamp", (millis / 1000).cast("timestamp"))
        return df.filter(F.col("_change_type").isin(types))

    empty = spark.createDataFrame([], spark_schema(data_schema(meta))).select(
        *columns, F.lit(None).cast("string").alias("_change_type"), F.lit(None).cast("long").alias("_commit_version"),
        F.lit(None).cast("timestamp").alias("_commit_timestamp"),
    )
    if not meta.keyed:
        # Append-only: the range's changes are the rows of the batches it made visible.
        files = [f for f in state.data_files() if start < state.visible_parts[f.segment_part] <= end]
        if not files:
            return empty
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
        return empty
    # Log files have unique (uuid) names; the commit that lists a file gives its events their version.
    version_of_file = spark.createDataFrame(
        [(f.path.rsplit("/", 1)[-1], v) for v, f in logs], "_file string, _commit_version long"
    )
    events = (
        spark.read.schema(segmentlog.FILE_SCHEMA_DDL).parquet(*[io.path(f.path) for _, f in logs])
        .select("*", F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1).alias("_file"))
        .join(F.broadcast(version_of_file), "_file")
        .drop("_file")
    )
    same_cause = Window.partitionBy("_commit_version", "cause")
    events = events.withColumn("_n", F.count(F.lit(1)).over(same_cause)).select(
        rowid.PART_COLUMN, rowid.SEQ_COLUMN,
        rowid.spark_packed().alias("_target"),
        F.when(F.col("event") == segmentlog.SET_VALID_FROM,
               F.when(F.col("_n") > 1, "update_postimage").otherwise("insert"))
        .otherwise(F.when(F.col("_n") > 1, "update_preimage").otherwise("delete")).alias("_change_type"),
        "_commit_version", "batch_index", "t", "cause",
    ).filter(F.col("_change_type").isin(types))
    # Only the data files of the segments the wanted events name are read.
    wanted = {tuple(r) for r in events.select(rowid.PART_COLUMN, rowid.SEQ_COLUMN).distinct().collect()}
    files = [f for f in state.data_files() if f.segment in wanted]
    if not files:
        return empty
    events = events.drop(rowid.PART_COLUMN, rowid.SEQ_COLUMN)
    rows = scan(spark, io, state, files).withColumn("_target", rowid.spark_packed())
    order = F.create_map(*[F.lit(x) for k, v in _ORDER.items() for x in (k, v)])
    df = rows.join(events, "_target").orderBy(
        "_commit_version", "batch_index", "t", "cause", F.element_at(order, F.col("_change_type"))
    )
    return finish(df.select(*columns, "_change_type", "_commit_version"))
