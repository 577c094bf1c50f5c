"""MetaGen: the second of Opal's two steps, one Spark job per commit.

It reads only the key, delta and row-id columns of the landed files, joins them with the key-store
buckets the batches touch, and applies the semantics contract per key with window functions:

* records are ordered by ``(batch index, delta, row id)``; the key store's record comes first;
* a record is accepted iff its delta is >= the maximum delta of every record before it (accepted
  deltas never decrease, so that maximum is the last accepted record's delta);
* an accepted record invalidates the previous accepted record if that one is a visible row
  (an upsert), and an accepted upsert becomes valid itself.

Executors then write the segment-log events and the new current bitmaps (grouped by segment) and the
key-store deltas (grouped by bucket) and report the file names; the driver only commits.
"""

from __future__ import annotations

import dataclasses
import json
import os
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from bitlake import bitmap, keystore, rowid, segmentlog
from bitlake.commitlog import Batch, LogFile, SegmentState
from bitlake.fs import FileIO
from bitlake.keystore import BucketFile
from bitlake.schema import spark_delta_as_long
from bitlake.spark.landing import data_schema, deletes_schema
from bitlake.state import TableState

LOGS_DIR = "_bitlake/logs"
BITMAPS_DIR = "_bitlake/bitmaps"

COUNTS = ("inserted", "updated", "deleted", "stale", "ignored_deletes")


@dataclasses.dataclass
class MetaGenOutput:
    segments: list[SegmentState]
    logs: list[LogFile]
    keystore_add: list[BucketFile]
    keystore_remove: list[str]
    batch_counts: dict[int, dict[str, int]]  # batch index -> counts

    def counts(self) -> dict[str, int]:
        return {k: sum(c[k] for c in self.batch_counts.values()) for k in COUNTS}

    def written(self) -> list[str]:
        paths = [f.path for f in self.logs] + [f.path for f in self.keystore_add]
        return paths + sorted({s.bitmap for s in self.segments if s.bitmap})


def run(spark, io: FileIO, state: TableState, batches: list[Batch], version: int) -> MetaGenOutput:
    """Computes the metadata that makes ``batches`` visible at ``version``; writes files, commits nothing."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from bitlake.schema import spark_schema

    meta = state.metadata
    pk = list(meta.primary_key)
    new_segments = _new_segments(batches)
    if not meta.keyed:
        # Append-only: every landed row is valid, which the counts say without a bitmap.
        segments = [dataclasses.replace(s, cardinality=s.data_rows) for s in new_segments.values()]
        counts = {i: {**dict.fromkeys(COUNTS, 0), "inserted": b.rows} for i, b in enumerate(batches)}
        return MetaGenOutput(segments, [], [], [], counts)
    data_paths = [io.path(f.path) for b in batches for f in b.files if f.kind == "data"]
    delete_paths = [io.path(f.path) for b in batches for f in b.files if f.kind == "deletes"]
    if not data_paths and not delete_paths:
        return MetaGenOutput(list(new_segments.values()), [], [], [], {})

    index_of = F.create_map(*[F.lit(x) for i, b in enumerate(batches) for x in (b.segment_part, i)])
    columns = pk + [meta.delta_column] + list(rowid.ROW_ID_COLUMNS)

    def records(paths, file_format, schema, is_delete):
        df = spark.read.format(file_format).schema(spark_schema(schema)).load(paths).select(columns)
        return df.select(
            *pk,
            spark_delta_as_long(meta).alias("_d"),
            rowid.spark_packed().alias("_rid"),
            F.lit(is_delete).alias("_is_delete"),
            F.element_at(index_of, F.col(rowid.PART_COLUMN)).cast("int").alias("_bidx"),
            F.lit(False).alias("_prior"),
        )

    parts = []
    if data_paths:
        parts.append(records(data_paths, meta.file_format, data_schema(meta), False))
    if delete_paths:
        parts.append(records(delete_paths, "parquet", deletes_schema(meta), True))
    batch = parts[0] if len(parts) == 1 else parts[0].unionByName(parts[1])
    batch = batch.withColumn(keystore.BUCKET, keystore.spark_bucket(meta))

    touched = sorted(r[0] for r in batch.select(keystore.BUCKET).distinct().collect())
    ks_paths = [io.path(f.path) for b in touched for f in state.keystore.get(b, [])]
    combined = batch
    if ks_paths:
        latest = Window.partitionBy(*pk).orderBy(F.col(keystore.SEQ).desc())
        prior = (
            spark.read.schema(spark_schema(keystore.file_schema(meta))).parquet(*ks_paths)
            .join(batch.select(*pk).distinct(), on=pk, how="left_semi")
            .withColumn("_n", F.row_number().over(latest))
            .filter("_n = 1")
            .select(
                *pk,
                F.col(keystore.DELTA).alias("_d"),
                F.col(keystore.ROW_ID).alias("_rid"),
                F.col(keystore.DELETED).alias("_is_delete"),
                F.lit(-1).alias("_bidx"),
                F.lit(True).alias("_prior"),
            )
            .withColumn(keystore.BUCKET, keystore.spark_bucket(meta))
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
        return _write(spark, io, state, fold, touched, new_segments, version)
    finally:
        fold.unpersist()


def _write(spark, io, state, fold, touched, new_segments, version) -> MetaGenOutput:
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
        F.col("_rid").alias("_target"), F.lit(segmentlog.SET_VALID_FROM).alias("event"),
        F.col("_d").alias("t"), F.col("_rid").alias("cause"), F.col("_bidx").alias("batch_index"),
    ))
    events = events.select(
        F.shiftright("_target", rowid.SEQ_BITS + rowid.OFFSET_BITS).cast("int").alias(rowid.PART_COLUMN),
        (F.shiftright("_target", rowid.OFFSET_BITS).bitwiseAND(rowid.MAX_SEQ)).cast("int").alias(rowid.SEQ_COLUMN),
        F.col("_target").bitwiseAND(rowid.MAX_OFFSET).cast("int").alias(rowid.OFFSET_COLUMN),
        F.col("event").cast("byte").alias("event"), "t", "cause", F.col("batch_index").cast("int"),
    )
    prior_bitmaps = {k: s.bitmap for k, s in state.segments.items() if s.bitmap}
    task = _SegmentTask(io.base, spark.sparkContext.broadcast(prior_bitmaps))
    seg_out = events.repartition(rowid.PART_COLUMN, rowid.SEQ_COLUMN).mapInArrow(task, _SEGMENT_OUT).collect()

    # Key-store deltas, grouped by bucket.
    ks_rows = fold.filter(acc & F.col("_later").isNull()).select(
        *pk,
        F.col("_d").alias(keystore.DELTA),
        F.col("_rid").alias(keystore.ROW_ID),
        F.col("_is_delete").alias(keystore.DELETED),
        F.lit(version).cast("long").alias(keystore.SEQ),
        keystore.BUCKET,
    )
    bucket_files = {b: [f.to_json() for f in state.keystore.get(b, [])] for b in touched}
    ks_task = _KeystoreTask(
        io.base, meta.to_json(), bucket_files,
        meta.int_prop("keystore.max_deltas"), float(meta.prop("keystore.base_merge_ratio")),
    )
    ks_out = (
        ks_rows.repartition(max(1, min(len(touched), spark.sparkContext.defaultParallelism * 4)), keystore.BUCKET)
        .mapInArrow(ks_task, _KEYSTORE_OUT)
        .collect()
    )

    segments = dict(new_segments)
    logs = []
    for r in seg_out:
        if r["kind"] == "log":
            logs.append(LogFile(r["path"], r["events"], r["bytes"], r["min_t"], r["max_t"]))
            continue
        key = (r["part"], r["seq"])
        current = segments.get(key) or state.segments[key]
        segments[key] = dataclasses.replace(current, bitmap=r["path"], cardinality=r["events"])
    ks_add, ks_remove = [], []
    for r in ks_out:
        ks_add.append(BucketFile(r["bucket"], r["path"], r["rows"], r["bytes"], r["base"]))
        ks_remove.extend(json.loads(r["replaces"]))
    return MetaGenOutput(
        sorted(segments.values(), key=lambda s: (s.part, s.seq)),
        sorted(logs, key=lambda f: f.path), sorted(ks_add, key=lambda f: (f.bucket, f.path)), ks_remove,
        batch_counts,
    )


def _new_segments(batches: list[Batch]) -> dict[tuple[int, int], SegmentState]:
    out: dict[tuple[int, int], SegmentState] = {}
    for b in batches:
        for f in b.files:
            s = out.get(f.segment) or SegmentState(f.segment_part, f.segment_seq, 0, 0)
            data = f.rows if f.kind == "data" else 0
            out[f.segment] = dataclasses.replace(s, offsets=s.offsets + f.rows, data_rows=s.data_rows + data)
    return out


_SEGMENT_OUT = "kind string, path string, part int, seq int, events long, bytes long, min_t long, max_t long"
_SEGMENT_ARROW = pa.schema([
    ("kind", pa.string()), ("path", pa.string()), ("part", pa.int32()), ("seq", pa.int32()),
    ("events", pa.int64()), ("bytes", pa.int64()), ("min_t", pa.int64()), ("max_t", pa.int64()),
])


@dataclasses.dataclass
class _SegmentTask:
    """Writes one log file with the task's events and one bitmap file with its segments' new bitmaps."""

    base: str
    prior_bitmaps: object  # a Spark broadcast of {(part, seq): bitmap file}

    def __call__(self, batches):
        batches = list(batches)
        if not batches:
            return
        table = pa.Table.from_batches(batches).cast(segmentlog.FILE_SCHEMA)
        if table.num_rows == 0:
            return
        table = table.take(pc.sort_indices(table, sort_keys=[
            (rowid.PART_COLUMN, "ascending"), (rowid.SEQ_COLUMN, "ascending"), (rowid.OFFSET_COLUMN, "ascending"),
        ]))
        name = f"{uuid.uuid4().hex}.parquet"
        log_path = os.path.join(self.base, LOGS_DIR, name)
        os.makedirs(os.path.dirname(log_path), exist_ok=True)
        pq.write_table(table, log_path, compression="zstd")
        t = table.column("t")
        rows = [{"kind": "log", "path": f"{LOGS_DIR}/{name}", "part": None, "seq": None,
                 "events": table.num_rows, "bytes": os.path.getsize(log_path),
                 "min_t": pc.min(t).as_py(), "max_t": pc.max(t).as_py()}]

        prior = self.prior_bitmaps.value
        cache = bitmap.BitmapCache(lambda p: os.path.join(self.base, p))
        parts = table.column(rowid.PART_COLUMN).to_numpy()
        seqs = table.column(rowid.SEQ_COLUMN).to_numpy()
        offsets = table.column(rowid.OFFSET_COLUMN).to_numpy()
        kinds = table.column("event").to_numpy()
        bitmaps = []
        # Segment boundaries of the sorted events, found vectorised (a per-row Python loop took seconds).
        cuts = np.flatnonzero((parts[1:] != parts[:-1]) | (seqs[1:] != seqs[:-1])) + 1
        bounds = [0, *cuts.tolist(), table.num_rows]
        for start, end in zip(bounds[:-1], bounds[1:], strict=True):
            part, seq = int(parts[start]), int(seqs[start])
            o, k = offsets[start:end], kinds[start:end]
            base = cache.get(prior.get((part, seq)), part, seq)
            bm = bitmap.apply_events(
                base, o[k == segmentlog.SET_VALID_FROM], o[k == segmentlog.SET_VALID_UNTIL]
            )
            bitmaps.append((part, seq, bm))
        name = f"{uuid.uuid4().hex}.parquet"
        bm_path = os.path.join(self.base, BITMAPS_DIR, name)
        os.makedirs(os.path.dirname(bm_path), exist_ok=True)
        bitmap.write_file(bm_path, bitmaps)
        for part, seq, bm in bitmaps:
            rows.append({"kind": "bitmap", "path": f"{BITMAPS_DIR}/{name}", "part": part, "seq": seq,
                         "events": len(bm), "bytes": 0, "min_t": None, "max_t": None})
        yield pa.RecordBatch.from_pylist(rows, schema=_SEGMENT_ARROW)


_KEYSTORE_OUT = "bucket int, path string, rows long, bytes long, base boolean, replaces string"
_KEYSTORE_ARROW = pa.schema([
    ("bucket", pa.int32()), ("path", pa.string()), ("rows", pa.int64()), ("bytes", pa.int64()),
    ("base", pa.bool_()), ("replaces", pa.string()),
])


@dataclasses.dataclass
class _KeystoreTask:
    """Writes one key-store delta per bucket, merged with older files when the bucket's plan says so."""

    base: str
    metadata: dict
    bucket_files: dict[int, list[dict]]
    max_deltas: int
    base_ratio: float

    def __call__(self, batches):
        from bitlake.schema import TableMetadata

        meta = TableMetadata.from_json(self.metadata)
        schema = keystore.file_schema(meta)
        pk = list(meta.primary_key)
        batches = list(batches)
        if not batches or sum(b.num_rows for b in batches) == 0:
            return
        table = pa.Table.from_batches(batches)
        out = []
        buckets = table.column(keystore.BUCKET)
        for bucket in pc.unique(buckets).to_pylist():
            rows = table.filter(pc.equal(buckets, bucket)).select(schema.names).cast(schema)
            files = [BucketFile.from_json(f) for f in self.bucket_files.get(bucket, [])]
            merge = keystore.merge_plan(files, rows.num_rows, self.max_deltas, self.base_ratio)
            if merge:
                older = [pq.read_table(os.path.join(self.base, f.path), schema=schema) for f in merge]
                rows = pa.concat_tables(older + [rows])
            rows = keystore.latest_per_key(rows, pk)
            rel = f"{keystore.bucket_dir(bucket)}/{uuid.uuid4().hex}.parquet"
            path = os.path.join(self.base, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            pq.write_table(rows, path, compression="zstd")
            # A bucket's first file, and a merge of all its files, is its new base.
            is_base = not files or len(merge) == len(files)
            out.append({"bucket": bucket, "path": rel, "rows": rows.num_rows, "bytes": os.path.getsize(path),
                        "base": is_base, "replaces": json.dumps([f.path for f in merge])})
        yield pa.RecordBatch.from_pylist(out, schema=_KEYSTORE_ARROW)
