"""The change feed as a Spark DataFrame: executes a :class:`~bitlake.engine.read.changes.ChangePlan` (what a
range's change rows are is decided there, for every reader)."""

from __future__ import annotations

import pyarrow as pa

from bitlake.engine.read.changes import ORDER, SORT_KEYS, ChangePlan
from bitlake.format import datafile, rowid
from bitlake.fs import FileIO
from bitlake.spark.reader import scan
from bitlake.spark.schema import spark_delta_as_long, spark_packed, spark_schema

# Row ids broadcast to the data-file scans at most (8 bytes each and a change type).
BROADCAST_ROWS = 2_000_000
# Ranges with at most this many change rows are sorted in a single task (one partition out).
SORT_IN_ONE_TASK_ROWS = 100_000


def _sql_map(pairs) -> str:
    """A SQL ``map(...)`` literal of integer keys and values: one expression for the JVM, however many
    entries (a Column per entry costs a Py4J round trip each)."""
    return "map(" + ", ".join(f"{int(k)}, {int(v)}" for k, v in pairs) + ")"


def read_changes(spark, io: FileIO, p: ChangePlan):
    """The plan's change rows, sorted, with ``_commit_timestamp``."""
    from pyspark.sql import functions as F

    meta = p.state.metadata
    columns = meta.column_names
    commit_timestamp = (F.element_at(F.expr(_sql_map(sorted(p.timestamps.items()))), F.col("_commit_version"))
                        / 1000).cast("timestamp").alias("_commit_timestamp")
    parts = []
    if p.new_files:
        part_col = F.col(rowid.PART_COLUMN)
        new = scan(spark, io, meta, p.new_files).filter(part_col.isin(sorted(p.live))).withColumn(
            "_rid", spark_packed())
        if len(p.stale):
            drop = spark.createDataFrame(pa.table({"_stale": p.stale}))
            new = new.join(F.broadcast(drop) if len(p.stale) <= BROADCAST_ROWS else drop,
                           F.col("_rid") == F.col("_stale"), "left_anti")
        version = F.element_at(F.expr(_sql_map(p.version_of.items())), part_col).cast("long")
        index = F.element_at(F.expr(_sql_map(p.index_of.items())), part_col).cast("int")
        if meta.keyed:
            causes = spark.createDataFrame(pa.table({"_cause": p.causes}))
            causes = F.broadcast(causes) if len(p.causes) <= BROADCAST_ROWS else causes
            kind = F.when(F.col("_cause").isNotNull(), "update_postimage").otherwise("insert")
            new = new.join(causes, F.col("_rid") == F.col("_cause"), "left")
            t = spark_delta_as_long(meta)
        else:
            kind, t = F.lit("insert"), F.lit(0).cast("long")
        parts.append(new.select(*columns, kind.alias("_change_type"), version.alias("_commit_version"),
                                index.alias("batch_index"), t.alias("t"), F.col("_rid").alias("cause"))
                     .filter(F.col("_change_type").isin(p.types)))
    if p.wanted.num_rows and p.target_files:
        wanted = spark.createDataFrame(p.wanted)
        old = scan(spark, io, meta, p.target_files).withColumn("_target", spark_packed())
        parts.append(old.join(F.broadcast(wanted) if p.wanted.num_rows <= BROADCAST_ROWS else wanted, "_target")
                     .select(*columns, "_change_type", "_commit_version", "batch_index", "t", "cause"))
    parts += [spark.createDataFrame(t) for t in p.carried]
    if not parts:
        return spark.createDataFrame([], spark_schema(datafile.data_schema(meta))).select(
            *columns, F.lit(None).cast("string").alias("_change_type"),
            F.lit(None).cast("long").alias("_commit_version"), F.lit(None).cast("timestamp").alias("_commit_timestamp"),
        )
    df = parts[0]
    for more in parts[1:]:
        df = df.unionByName(more)
    order = F.element_at(F.create_map(*[F.lit(x) for kv in ORDER.items() for x in kv]), F.col("_change_type"))
    keys = [order if k == "_order" else k for k in SORT_KEYS]
    if p.rows() <= SORT_IN_ONE_TASK_ROWS:
        df = df.repartition(1).sortWithinPartitions(*keys)
    else:
        df = df.repartition("_commit_version", "cause").orderBy(*keys)
    return df.select(*columns, "_change_type", "_commit_version", commit_timestamp)
