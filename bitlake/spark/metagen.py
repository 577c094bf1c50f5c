"""The Spark MetaGen: the second of Opal's two steps as one Spark job per commit.

It reads the batches' records (key, delta, row id, delete flag, bucket: derived from the data files' columns
for upserts, from the keys files for deletes), joins them with the
key-store buckets the batches touch, and applies the semantics contract per key with window functions:

* records are ordered by ``(batch index, delta, row id)``; the key store's record comes first;
* a record is accepted iff its delta is >= the maximum delta of every record before it (accepted
  deltas never decrease, so that maximum is the last accepted record's delta);
* an accepted record invalidates the previous accepted record if that one is a visible row
  (an upsert), and an accepted upsert becomes valid itself.

Executors then write the segment-log events and the new current bitmaps (grouped by segment) and the
key-store increments (grouped by bucket) and report the file names; the driver only commits.
"""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa

from bitlake.engine.write.metagen import (
    BECOMES_VALID,
    COUNTS,
    SEGMENT_ARROW,
    SEGMENT_DDL,
    Landed,
    MetaGenOutput,
    assemble,
    new_segments,
    unkeyed_output,
    write_segments,
)
from bitlake.format import datafile, keystore, rowid, segmentlog
from bitlake.format.commit import BucketFile, SegmentState
from bitlake.format.metadata import TableMetadata
from bitlake.format.state import TableState
from bitlake.fs import FileIO
from bitlake.spark import files as spark_files
from bitlake.spark.schema import spark_schema, spark_typed


def run(spark, io: FileIO, state: TableState, batches: list[Landed], version: int) -> MetaGenOutput:
    """Computes the metadata that makes ``batches`` visible at ``version``; writes files, commits nothing."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F


    meta = state.metadata
    pk = list(meta.primary_key)
    if not meta.keyed:
        return unkeyed_output(batches)
    spark_files.require_shared(io)
    records = _records(spark, io, meta, batches)
    if records is None:
        return MetaGenOutput(list(new_segments(batches).values()), [], [], [], {})

    index_of = F.create_map(*[F.lit(x) for i, b in enumerate(batches) for x in (b.part, i)])
    part = F.shiftright(keystore.ROW_ID, rowid.PART_SHIFT).cast("int")
    batch = records.select(
        *pk,
        F.col(keystore.DELTA).alias("_d"),
        F.col(keystore.ROW_ID).alias("_rid"),
        F.col(keystore.DELETED).alias("_is_delete"),
        F.element_at(index_of, part).cast("int").alias("_bidx"),
        F.lit(False).alias("_prior"),
        keystore.BUCKET,
    )

    touched = sorted(r[0] for r in batch.select(keystore.BUCKET).distinct().collect())
    ks_paths = [f.path for b in [*touched, keystore.SHARED] for f in state.keystore.get(b, [])]
    combined = batch
    if ks_paths:
        latest = Window.partitionBy(*pk).orderBy(F.col(keystore.VERSION).desc())
        prior = (
            spark_files.read(spark, io, ks_paths, keystore.file_schema(meta))
            .join(batch.select(*pk, keystore.BUCKET).distinct(), on=pk, how="inner")
            .withColumn("_n", F.row_number().over(latest))
            .filter("_n = 1")
            .select(
                *pk,
                F.col(keystore.DELTA).alias("_d"),
                F.col(keystore.ROW_ID).alias("_rid"),
                F.col(keystore.DELETED).alias("_is_delete"),
                F.lit(-1).alias("_bidx"),
                F.lit(True).alias("_prior"),
                keystore.BUCKET,
            )
        )
        combined = prior.unionByName(batch)

    w = Window.partitionBy(*pk).orderBy("_bidx", "_d", "_rid")
    before = w.rowsBetween(Window.unboundedPreceding, -1)
    after = w.rowsBetween(1, Window.unboundedFollowing)
    fold = combined.withColumn("_prev_max", F.max("_d").over(before)).withColumn(
        "_accepted", F.col("_prior") | F.col("_prev_max").isNull() | (F.col("_d") >= F.col("_prev_max"))
    )
    fold = (
        fold.withColumn("_acc_rid", F.when(F.col("_accepted"), F.col("_rid")))
        .withColumn("_acc_del", F.when(F.col("_accepted"), F.col("_is_delete")))
        .withColumn("_last_rid", F.last("_acc_rid", ignorenulls=True).over(before))
        .withColumn("_last_del", F.last("_acc_del", ignorenulls=True).over(before))
        .withColumn("_later", F.first("_acc_rid", ignorenulls=True).over(after))
        .filter(~F.col("_prior"))
        .withColumn(
            "_until",
            F.col("_accepted") & F.col("_last_rid").isNotNull() & ~F.coalesce(F.col("_last_del"), F.lit(True)),
        )
        .persist()
    )
    try:
        return _write(spark, io, state, batches, fold, touched, version)
    finally:
        fold.unpersist()


def _records(spark, io: FileIO, meta: TableMetadata, batches: list[Landed]):
    """The batches' records as keys-file rows: the upserts derived from their data files' columns by the
    driver's own code (:func:`bitlake.format.datafile.keys_of`) in the tasks, and their keys files' deletes.
    None when they have none."""
    from pyspark.sql import functions as F

    keys_schema = spark_schema(datafile.keys_schema(meta))
    parts = []
    data_paths = [f.path for b in batches for f in b.data_files]
    if data_paths:
        metadata = meta.to_json()

        def derive(batches_in):
            m = TableMetadata.from_json(metadata)
            for rb in batches_in:
                yield from spark_typed(datafile.keys_of(rb, m).to_batches())

        columns = datafile.data_schema(meta)
        upserts = pa.schema([columns.field(c) for c in datafile.upsert_columns(meta)])
        parts.append(spark_files.read(spark, io, data_paths, upserts, meta.file_format).mapInArrow(derive, keys_schema))
    key_paths = [f.path for b in batches for f in b.keys_files]
    if key_paths:
        parts.append(spark_files.read(spark, io, key_paths, datafile.keys_schema(meta)).filter(F.col(keystore.DELETED)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])


def _write(spark, io, state, batches, fold, touched, version) -> MetaGenOutput:
    from pyspark.sql import functions as F

    meta = state.metadata
    pk = list(meta.primary_key)
    acc, upsert, until = F.col("_accepted"), ~F.col("_is_delete"), F.col("_until")
    one = F.lit(1)
    per_batch = fold.groupBy("_bidx").agg(
        F.sum(F.when(acc & upsert & ~until, one).otherwise(0)).alias("inserted"),
        F.sum(F.when(acc & upsert & until, one).otherwise(0)).alias("updated"),
        F.sum(F.when(acc & ~upsert & until, one).otherwise(0)).alias("deleted"),
        F.sum(F.when(~acc, one).otherwise(0)).alias("stale"),
        F.sum(F.when(acc & ~upsert & ~until, one).otherwise(0)).alias("ignored_deletes"),
    ).collect()
    batch_counts = {r["_bidx"]: {k: int(r[k]) for k in COUNTS} for r in per_batch}

    # Segment-log events and current bitmaps, grouped by segment.
    accepted = fold.filter(acc)
    events = accepted.filter(until).select(
        F.col("_last_rid").alias("_target"), F.lit(segmentlog.SET_VALID_UNTIL).alias("event"),
        F.col("_d").alias("t"), F.col("_rid").alias("cause"), F.col("_bidx").alias("batch_index"),
    ).unionByName(accepted.filter(upsert).select(
        F.col("_rid").alias("_target"), F.lit(BECOMES_VALID).alias("event"),
        F.col("_d").alias("t"), F.col("_rid").alias("cause"), F.col("_bidx").alias("batch_index"),
    ))
    events = events.select(
        F.shiftright("_target", rowid.PART_SHIFT).cast("int").alias(rowid.PART_COLUMN),
        (F.shiftright("_target", rowid.OFFSET_BITS).bitwiseAND(rowid.MAX_SEQ)).cast("int").alias(rowid.SEQ_COLUMN),
        F.col("_target").bitwiseAND(rowid.MAX_OFFSET).cast("int").alias(rowid.OFFSET_COLUMN),
        F.col("event").cast("byte").alias("event"), "t", "cause", F.col("batch_index").cast("int"),
    )
    prior = [s.to_json() for s in state.segments.values()]
    task = _SegmentTask(io, spark_files.shared(spark, prior), state.metadata.prop("bitmap.deltas"))
    seg_out = events.repartition(rowid.PART_COLUMN, rowid.SEQ_COLUMN).mapInArrow(task, SEGMENT_DDL).collect()

    # Key-store increments, grouped by bucket.
    ks_rows = fold.filter(acc & F.col("_later").isNull()).select(
        *pk,
        F.col("_d").alias(keystore.DELTA),
        F.col("_rid").alias(keystore.ROW_ID),
        F.col("_is_delete").alias(keystore.DELETED),
        F.lit(version).cast("long").alias(keystore.VERSION),
        keystore.BUCKET,
    )
    bucket_files = {b: [f.to_json() for f in state.keystore.get(b, [])] for b in touched}
    ks_task = _KeystoreTask(io, meta.to_json(), bucket_files)
    ks_out = (
        ks_rows.repartition(max(1, min(len(touched), spark_files.parallelism(spark) * 4)), keystore.BUCKET)
        .mapInArrow(ks_task, _KEYSTORE_DDL)
        .collect()
    )
    added = [BucketFile(r["bucket"], r["path"], r["rows"], r["bytes"], r["base"]) for r in ks_out]
    replaced = [p for r in ks_out for p in json.loads(r["replaces"])]
    return assemble(state, batches, [r.asDict() for r in seg_out], added, replaced, batch_counts)


@dataclasses.dataclass
class _SegmentTask:
    """A task's events, as one log file and one bitmap file (:func:`bitlake.engine.write.metagen.write_segments`)."""

    io: FileIO
    prior: object  # the segment states before the commit, as JSON, shared with the tasks (spark_files.shared)
    deltas: str  # the table property bitmap.deltas

    def __call__(self, batches):
        batches = list(batches)
        if not batches:
            return
        prior = {(s["part"], s["seq"]): SegmentState.from_json(s) for s in self.prior.value}
        rows = write_segments(self.io, prior, pa.Table.from_batches(batches), deltas=self.deltas)
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=SEGMENT_ARROW)


_KEYSTORE_ARROW = pa.schema([
    ("bucket", pa.int32()), ("path", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
    ("base", pa.bool_()), ("replaces", pa.string()),
])
_KEYSTORE_DDL = "bucket int, path string, rows long, bytes long, base boolean, replaces string"


@dataclasses.dataclass
class _KeystoreTask:
    """A task's key-store rows, as one file per bucket (:func:`bitlake.format.keystore.write_bucket_files`)."""

    io: FileIO
    metadata: dict
    bucket_files: dict[int, list[dict]]

    def __call__(self, batches):
        batches = list(batches)
        if not batches or sum(b.num_rows for b in batches) == 0:
            return
        meta = TableMetadata.from_json(self.metadata)
        files = {b: [BucketFile.from_json(f) for f in fs] for b, fs in self.bucket_files.items()}
        added, replaced = keystore.write_bucket_files(self.io, meta, files, pa.Table.from_batches(batches))
        rows = [{**f.to_json(), "replaces": json.dumps(replaced if i == 0 else [])} for i, f in enumerate(added)]
        yield pa.RecordBatch.from_pylist(rows, schema=_KEYSTORE_ARROW)
